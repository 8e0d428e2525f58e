// Part of radosgw.sh start: creates the bucket named in the env file (KEY=VALUE lines) with
// versioning enabled, retrying while radosgw finishes starting (refused connections, 5xx, a
// user not yet visible), and checks versioning reads back Enabled. Exits 1 saying why.
// S3 API: CreateBucket, PutBucketVersioning, GetBucketVersioning.
import { readFileSync } from 'node:fs';
import { CreateBucketCommand, GetBucketVersioningCommand, PutBucketVersioningCommand, S3Client } from '@aws-sdk/client-s3';

// The SDK's notice that its 2027 releases need Node 22: not news for a test server.
process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED = 'true';
const env = Object.fromEntries(
  readFileSync(process.argv[2], 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
);
const s3 = new S3Client({
  endpoint: env.AWS_ENDPOINT_URL,
  region: env.AWS_REGION,
  forcePathStyle: true,
  credentials: { accessKeyId: env.AWS_ACCESS_KEY_ID, secretAccessKey: env.AWS_SECRET_ACCESS_KEY },
  maxAttempts: 1,
});
const Bucket = env.SBX_S3_BUCKET;
const deadline = Date.now() + 60_000;

async function retrying(what, fn) {
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (err.name === 'BucketAlreadyOwnedByYou') return;
      const status = err.$metadata?.httpStatusCode;
      if (Date.now() > deadline || (status !== undefined && status < 500 && err.name !== 'InvalidAccessKeyId')) {
        console.error(`create-bucket: ${what} ${Bucket} at ${env.AWS_ENDPOINT_URL}: ${err.name}${status ? ` (HTTP ${status})` : ''}: ${err.message}`);
        process.exit(1);
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}

await retrying('CreateBucket', () => s3.send(new CreateBucketCommand({ Bucket })));
await retrying('PutBucketVersioning', () => s3.send(new PutBucketVersioningCommand({ Bucket, VersioningConfiguration: { Status: 'Enabled' } })));
const v = await retrying('GetBucketVersioning', () => s3.send(new GetBucketVersioningCommand({ Bucket })));
if (v?.Status !== 'Enabled') {
  console.error(`create-bucket: versioning of ${Bucket} reads back ${JSON.stringify(v?.Status)}, not Enabled`);
  process.exit(1);
}
