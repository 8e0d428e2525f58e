#!/usr/bin/env node
// sandbox-supervisor: the daemon's entry. `sandbox-supervisor serve [--config FILE]` runs it
// in the foreground: load and validate the configuration, become child subreaper, set up
// the cgroup subtree (or subreaper mode), listen on the socket (and, with --metrics, the
// Prometheus endpoint), and on SIGTERM/SIGINT stop admission, settle every session with
// receipts, and exit 0.
import { realpathSync } from 'node:fs';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command } from 'commander';
import { pino, type Logger } from 'pino';
import { ConfigError, loadConfig, remoteInsecureProblem, remoteListenProblem } from './config.js';
import { VERSION } from '../ipc/version.js';
import { SupervisorServer } from './server/server.js';
import type { RemoteListener } from './server/remote.js';
import type { Supervisor } from './supervisor.js';
import { compose } from './compose.js';
import { notify, startWatchdog, takeListenFd } from './systemd.js';
import { missingNodeFlags, SUPERVISOR_NODE_FLAGS } from './node-flags.js';
import { parseMetricsAddress } from './metrics/address.js';
import type { MetricsListener } from './metrics/http.js';
import type { SupervisorMetrics } from './metrics/registry.js';

/**
 * The Prometheus registry and its endpoint (metrics.listen), loaded only when asked for;
 * ConfigError (exit 2) when the address cannot be listened on.
 */
async function startMetrics(listen: string, source: string, log: Logger): Promise<{ metrics: SupervisorMetrics; listener: MetricsListener }> {
  const [{ SupervisorMetrics }, { listenMetrics }] = await Promise.all([import('./metrics/registry.js'), import('./metrics/http.js')]);
  const metrics = new SupervisorMetrics();
  const listener = await listenMetrics(parseMetricsAddress(listen), () => metrics.render(), log, source);
  return { metrics, listener };
}

async function serve(options: { config?: string; workspace?: string[]; metrics?: string; listen?: string }): Promise<void> {
  let config;
  /** Where metrics.listen came from, as the messages name it. */
  const metricsSource = options.metrics !== undefined ? '--metrics' : 'metrics.listen';
  try {
    config = loadConfig(options.config);
    if (options.workspace?.length) {
      const relative = options.workspace.filter((p) => !p.startsWith('/'));
      if (relative.length) throw new ConfigError(`--workspace must be an absolute path: ${relative.map((p) => JSON.stringify(p)).join(', ')}`);
      config = { ...config, workspace: { ...config.workspace, paths: [...config.workspace.paths, ...options.workspace] } };
    }
    if (options.metrics !== undefined) {
      try {
        parseMetricsAddress(options.metrics);
      } catch (err) {
        throw new ConfigError(`--metrics ${(err as Error).message}`);
      }
      config = { ...config, metrics: { listen: options.metrics } };
    }
    if (options.listen !== undefined) {
      const problem = remoteListenProblem(options.listen) ?? remoteInsecureProblem(options.listen, config.remote.insecure);
      if (problem) throw new ConfigError(`--listen ${problem}`);
      config = { ...config, remote: { ...config.remote, listen: options.listen } };
    }
    const listen = config.metrics.listen;
    if (listen !== undefined && listen.startsWith('/') && resolve(listen) === resolve(config.socketPath)) {
      throw new ConfigError(`${metricsSource} ${listen} is the supervisor's own socket (SBX_SOCKET or socketPath): give the metrics another path`);
    }
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`sandbox-supervisor: ${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }
  const log = pino({ name: 'sandbox-supervisor', level: config.logLevel });
  log.info(
    {
      config: config.source,
      socket: config.socketPath,
      state_dir: config.stateDir,
      node_flags: process.execArgv,
      node_options: process.env.NODE_OPTIONS || undefined,
    },
    'starting',
  );
  const missing = missingNodeFlags();
  if (missing.length > 0)
    log.warn(
      { missing },
      `started without the node flags that bound its memory, or with looser values (${missing.join(' ')}): start it as node ${SUPERVISOR_NODE_FLAGS.join(' ')} ${process.argv[1] ?? 'main.js'} ... (npm start, the systemd unit and the installed launcher do)`,
    );
  // The metrics endpoint first: an address that cannot be had stops the start before the
  // state dir, the lock or a cgroup is touched.
  let metrics: Awaited<ReturnType<typeof startMetrics>> | null = null;
  if (config.metrics.listen !== undefined) {
    try {
      metrics = await startMetrics(config.metrics.listen, metricsSource, log);
    } catch (err) {
      if (err instanceof ConfigError) {
        process.stderr.write(`sandbox-supervisor: ${err.message}\n`);
        process.exit(2);
      }
      throw err;
    }
  }
  let supervisor: Supervisor;
  try {
    supervisor = compose(config, log, metrics?.metrics ?? null);
  } catch (err) {
    await metrics?.listener.close();
    // A configuration this host cannot honour (session.defaultLimits without their controller): exit 2, as a bad key.
    if (err instanceof ConfigError) {
      process.stderr.write(`sandbox-supervisor: ${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }
  supervisor.statusReporter.metricsAddress = metrics?.listener.address ?? null;
  await supervisor.ctx.watcher.ready; // every workspace marked before the first launch
  const server = new SupervisorServer(supervisor, log, config.socketPath);
  // The WebSocket listener (remote.listen / --listen) before the socket: a supervisor whose
  // listener cannot start (no token, the address taken) serves nobody, exit 2.
  let remote: RemoteListener | null = null;
  if (config.remote.listen !== undefined) {
    try {
      const { RemoteListener } = await import('./server/remote.js');
      remote = await RemoteListener.start(server.serveContext, server.pendingFrameAccount, config.remote.listen);
    } catch (err) {
      supervisor.ctx.tree?.teardown(); // nothing ran: the cgroup subtree made at start goes
      await metrics?.listener.close();
      if (err instanceof ConfigError) {
        process.stderr.write(`sandbox-supervisor: ${err.message}\n`);
        process.exit(2);
      }
      throw err;
    }
    supervisor.statusReporter.remoteUrl = remote.url;
    const t = remote.token;
    log.info(
      {
        url: remote.url,
        token:
          t.kind === 'file'
            ? `file ${t.file}`
            : t.kind === 'none'
              ? 'none (remote.insecure, loopback only)'
              : t.kind === 'env'
                ? 'SBX_REMOTE_TOKEN'
                : 'remote.token',
      },
      'WebSocket listener up',
    );
    if (t.kind === 'file') process.stderr.write(`sandbox-supervisor: WebSocket listener on ${remote.url}; bearer token in ${t.file}\n`);
  }
  const listenFd = takeListenFd();
  try {
    await server.listen(listenFd);
  } catch (err) {
    await remote?.close(0);
    supervisor.ctx.tree?.teardown(); // nothing ran: the cgroup subtree made at start goes
    await metrics?.listener.close();
    throw err;
  }
  const remoteListener = remote;
  metrics?.metrics.observe({
    sessions: () => supervisor.list(true),
    connections: () => server.connectionCount,
    remoteConnections: () => remoteListener?.connectionCount ?? 0,
    workspaces: () => supervisor.ctx.watcher.status(),
    attribution: () => ({
      unplaced: supervisor.ctx.watcher.unplaced,
      dropped: supervisor.ctx.watcher.dropped,
      own: supervisor.ctx.watcher.own,
      ...supervisor.ctx.reaper.holds,
    }),
    mode: supervisor.mode,
  });
  log.info({ socket: config.socketPath, mode: supervisor.mode, socket_activated: listenFd !== null }, 'listening');
  const stopWatchdog = startWatchdog();
  // READY=1 once the socket listens and reconciliation has looked at every session.
  void supervisor.reconcile().then(() => {
    supervisor.startRetention();
    notify(`READY=1\nSTATUS=serving, ${supervisor.mode} mode`);
  });

  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, 'stopping');
    notify('STOPPING=1');
    stopWatchdog();
    void supervisor
      .shutdown()
      .then(() => Promise.all([server.close(), remoteListener?.close()]))
      .then(() => metrics?.listener.close())
      .then(() => {
        log.info('stopped');
        process.exit(0);
      });
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
  process.on('SIGHUP', () => {}); // a lost terminal is not a reason to drop sessions
}

/** The commander definition of the daemon's commands; exported for scripts/docs/generate.ts (man/sandbox-supervisor.8). */
export const program = new Command()
  .name('sandbox-supervisor')
  .description('Runs commands to the end: cgroup v2 leaves, durable byte-exact output, receipts with death evidence.')
  .version(VERSION);

program
  .command('serve')
  .description('run the supervisor in the foreground')
  .option('--config <file>', 'JSON configuration (default: /etc/sandbox-supervisor/config.json if present)')
  .option('--workspace <dir>', 'watch this directory (repeatable; added to workspace.paths)', (dir: string, prev: string[] = []) => [...prev, dir])
  .option('--metrics <addr>', 'serve Prometheus metrics at GET /metrics on HOST:PORT (e.g. 127.0.0.1:9464) or a Unix socket path (overrides metrics.listen)')
  .option(
    '--listen <addr>',
    'also serve the protocol over WebSocket on HOST:PORT (e.g. 127.0.0.1:7443; token auth, docs/guide/remote.md; overrides remote.listen)',
  )
  .action((opts: { config?: string; workspace?: string[]; metrics?: string; listen?: string }) =>
    serve(opts).catch((err: Error) => {
      process.stderr.write(`sandbox-supervisor: ${err.message}\n`);
      process.exit(1);
    }),
  );

/** Whether node was started with this module as its script (symbolic links resolved): imported, it runs nothing. */
function isEntry(): boolean {
  try {
    return process.argv[1] !== undefined && realpathSync(process.argv[1]) === realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false;
  }
}

if (isEntry()) {
  program.parseAsync(process.argv).catch((err: Error) => {
    process.stderr.write(`sandbox-supervisor: ${err.message}\n`);
    process.exit(2);
  });
}
