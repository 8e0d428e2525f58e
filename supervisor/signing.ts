// The supervisor's receipt signing key: an Ed25519 key pair made at first start in the state
// dir (receipt-key, PKCS#8 PEM, 0600; receipt-key.pub, SPKI PEM), and the signature of each
// receipt as docs/reference/contract.md "Receipt" says (over the JCS encoding of the receipt without `signature`).
import { createPrivateKey, createPublicKey, generateKeyPairSync, sign, type KeyObject } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Receipt } from '../ipc/protocol.js';
import { STATE } from '../core/state/names.js';
import { keyIdOf, signedBytes } from '../core/receipts/verify.js';
import { writeFileDurable } from '../core/fs/durable.js';

export class ReceiptSigner {
  readonly keyId: string;
  readonly publicKeyPem: string;

  private constructor(private readonly privateKey: KeyObject) {
    const publicKey = createPublicKey(privateKey);
    this.publicKeyPem = publicKey.export({ type: 'spki', format: 'pem' }).toString();
    this.keyId = keyIdOf(publicKey);
  }

  /** The private key as PKCS#8 PEM, for the checkpoint thread (same process), which signs manifests off the event loop. */
  get privateKeyPem(): string {
    return this.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
  }

  /** Loads <stateDir>/receipt-key, or makes the pair (and receipt-key.pub) on first start. */
  static loadOrCreate(stateDir: string): ReceiptSigner {
    const privatePath = join(stateDir, STATE.receiptKey);
    const publicPath = join(stateDir, STATE.receiptKeyPub);
    if (!existsSync(privatePath)) {
      const { privateKey } = generateKeyPairSync('ed25519');
      writeFileDurable(privatePath, privateKey.export({ type: 'pkcs8', format: 'pem' }), 0o600);
    }
    const signer = new ReceiptSigner(createPrivateKey(readFileSync(privatePath)));
    if (!existsSync(publicPath) || readFileSync(publicPath, 'utf8') !== signer.publicKeyPem) {
      writeFileDurable(publicPath, signer.publicKeyPem, 0o644);
    }
    return signer;
  }

  /** The receipt (or close receipt) with its signature (any previous one is replaced). */
  sign<T extends { signature?: unknown }>(receipt: T): T {
    const { signature: _old, ...unsigned } = receipt;
    const value = sign(null, signedBytes(unsigned as unknown as Receipt), this.privateKey).toString('base64');
    return { ...unsigned, signature: { alg: 'ed25519', key_id: this.keyId, value } } as T;
  }
}
