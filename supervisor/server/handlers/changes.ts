// changes: what one session changed in each workspace (its change log, renames paired), with
// the evidence its receipt carries once it has ended (terminal_mutation, gap, unattributed).
import type { ChangesResult } from '../../../ipc/protocol.js';
import { type Change, pairRenames, readChanges } from '../../workspace/changes.js';
import { fsEncode, nameText } from '../../../core/fs/names.js';
import type { Handler } from '../handler.js';

export const changes: Handler<'changes'> = ({ supervisor }, params): ChangesResult => {
  const session = supervisor.find(params);
  const watcher = supervisor.ctx.watcher;
  const live = watcher.liveChanges(session.id);
  const { epoch, records, dropped } = readChanges(session.dir);
  const entries = session.receipt?.workspace ?? [];
  const paths = entries.length ? entries.map((e) => e.path) : watcher.paths;
  return {
    session_id: session.id,
    state: session.state,
    workspaces: paths.map((path, i) => {
      const entry = entries[i];
      return {
        path,
        // The sequence numbers are the change log's listener's (after a restart: an earlier epoch than the receipt's).
        epoch: epoch ?? entry?.epoch ?? (live ? watcher.epoch : null),
        changes: pairRenames(records.filter((r) => r.ws === i)).map(asText),
        dropped: live ? live.dropped : dropped,
        unattributed_events: entry ? entry.unattributed_events : (live?.unattributed[i] ?? null),
        terminal_mutation: entry?.terminal_mutation ?? null,
        gap: entry?.gap ?? null,
      };
    }),
  };
};

/** A change with text names (a msgpack frame makes a lone surrogate U+FFFD): \xNN, and the bytes in path_b64/from_b64. */
function asText(c: Change): Change & { path_b64?: string; from_b64?: string } {
  const path = nameText(c.path);
  const from = c.from === undefined ? undefined : nameText(c.from);
  return {
    ...c,
    path,
    ...(from !== undefined ? { from } : {}),
    ...(path !== c.path ? { path_b64: fsEncode(c.path).toString('base64') } : {}),
    ...(from !== undefined && from !== c.from ? { from_b64: fsEncode(c.from!).toString('base64') } : {}),
  };
}
