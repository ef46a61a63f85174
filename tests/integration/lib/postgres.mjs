// A real PostgreSQL server for a test: Debian's initdb into a temporary folder, the postmaster on
// a free loopback port (and a socket in that folder), trusting local connections. Run as root
// (as CI runs), the cluster belongs to the `postgres` user, as PostgreSQL refuses to run as root.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { freePort, makeStateDir, sleep } from './server.mjs';

// The newest version's programs; none fails the tests that need them rather than passing them
// unrun: `make test` installs the server (deploy/install-deps.sh).
function binaries() {
  const root = '/usr/lib/postgresql';
  const versions = fs.existsSync(root) ? fs.readdirSync(root).filter((v) => fs.existsSync(path.join(root, v, 'bin', 'postgres'))) : [];
  versions.sort((a, b) => Number(a) - Number(b));
  return versions.length ? path.join(root, versions.at(-1), 'bin') : null;
}

const asRoot = process.getuid?.() === 0;
// argv run as the cluster's owner.
const owned = (argv) => (asRoot ? ['setpriv', '--reuid=postgres', '--regid=postgres', '--init-groups', ...argv] : argv);

function accepting(port) {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    const done = (ok) => { socket.destroy(); resolve(ok); };
    socket.setTimeout(500, () => done(false));
    socket.on('error', () => done(false));
    socket.on('connect', () => done(true));
  });
}

// The postmaster's children (each backend is a process group of its own, so a signal to the
// postmaster's group would not reach them).
function children(pid) {
  const out = [];
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${entry}/stat`, 'utf8');
      const parent = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (parent === pid) out.push(Number(entry));
    } catch { /* gone meanwhile */ }
  }
  return out;
}

// Starts one; resolves once it takes connections. pg.url(db) is a libpq URL; pg.createDatabase(name)
// makes one; pg.stop() kills it as a crash would (SIGKILL, every process); pg.start() starts it
// again on the same port with what it held; pg.sql(db, text) runs SQL through psql.
export async function startPostgres() {
  const bin = binaries();
  if (!bin) throw new Error('PostgreSQL is not installed (deploy/install-deps.sh installs Debian\'s postgresql)');
  const dir = makeStateDir();
  if (asRoot) {
    fs.chmodSync(dir, 0o777);
    spawnSync('chown', ['postgres:postgres', dir]);
  }
  const data = path.join(dir, 'data');
  const initdb = owned([path.join(bin, 'initdb'), '-D', data, '-U', 'edge', '--auth=trust', '-E', 'UTF8', '--no-sync',
    '--locale=C']);
  const init = spawnSync(initdb[0], initdb.slice(1), { encoding: 'utf8' });
  if (init.status !== 0) throw new Error(`initdb failed:\n${init.stdout}\n${init.stderr}`);
  const pg = { port: await freePort(), log: '', child: null };
  pg.url = (db = 'postgres') => `postgresql://edge@127.0.0.1:${pg.port}/${db}`;
  pg.start = async () => {
    const argv = owned([path.join(bin, 'postgres'), '-D', data, '-p', String(pg.port), '-c', 'listen_addresses=127.0.0.1',
      '-c', `unix_socket_directories=${dir}`, '-c', 'fsync=off', '-c', 'max_connections=200']);
    const child = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    pg.child = child;
    pg.exited = new Promise((r) => child.on('exit', r));
    child.stdout.on('data', (d) => { pg.log += d; });
    child.stderr.on('data', (d) => { pg.log += d; });
    const deadline = Date.now() + 20000;
    while (!(await accepting(pg.port)) || !pg.log.includes('ready to accept connections')) {
      if (child.exitCode !== null) throw new Error(`postgres exited:\n${pg.log}`);
      if (Date.now() > deadline) { await pg.stop(); throw new Error(`postgres did not start:\n${pg.log}`); }
      await sleep(50);
    }
  };
  pg.stop = async () => {
    const child = pg.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    for (const pid of children(child.pid)) { try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ } }
    child.kill('SIGKILL');
    await pg.exited;
    pg.log = '';
  };
  pg.sql = (db, text) => {
    const run = spawnSync('psql', ['-X', '-q', '-t', '-A', '-v', 'ON_ERROR_STOP=1', '-d', pg.url(db), '-c', text], { encoding: 'utf8' });
    if (run.status !== 0) throw new Error(`psql: ${run.stderr}`);
    return run.stdout.trim();
  };
  pg.createDatabase = (name) => { pg.sql('postgres', `CREATE DATABASE ${name}`); return pg.url(name); };
  await pg.start();
  return pg;
}
