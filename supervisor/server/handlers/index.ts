// The dispatch table: one handler per method, each in its own file (hello is the dispatch's
// own: it comes before any other request on a connection).
import type { MethodName } from '../../../ipc/methods.js';
import type { Handler } from '../handler.js';
import { cancel } from './cancel.js';
import { changes } from './changes.js';
import { checkpoint } from './checkpoint.js';
import { close } from './close.js';
import { download, readFile, upload, writeFile } from './files.js';
import { gc } from './gc.js';
import { kill } from './kill.js';
import { launch } from './launch.js';
import { ping } from './ping.js';
import { ps } from './ps.js';
import { readIndex } from './read-index.js';
import { receipt } from './receipt.js';
import { resize } from './resize.js';
import { resolve } from './resolve.js';
import { seal } from './seal.js';
import { status } from './status.js';
import { subscribe } from './subscribe.js';
import { wait } from './wait.js';
import { write } from './write.js';

export const HANDLERS: { [M in Exclude<MethodName, 'hello'>]: Handler<M> } = {
  launch,
  subscribe,
  read_index: readIndex,
  wait,
  receipt,
  cancel,
  kill,
  ps,
  gc,
  seal,
  close,
  status,
  ping,
  write,
  resize,
  resolve,
  changes,
  checkpoint,
  write_file: writeFile,
  read_file: readFile,
  upload,
  download,
};
