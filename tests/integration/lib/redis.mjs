// A real redis-server for a test: on a free loopback port, no persistence, in a temporary folder.
import { spawn, spawnSync } from 'node:child_process';
import net from 'node:net';
import { freePort, makeStateDir, sleep } from './server.mjs';

// No redis-server fails the tests that need one, rather than passing them unrun: `make test`
// installs it (deploy/install-deps.sh).
const haveRedis = spawnSync('redis-server', ['--version']).status === 0;

function ping(port) {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    const done = (ok) => { socket.destroy(); resolve(ok); };
    socket.setTimeout(500, () => done(false));
    socket.on('error', () => done(false));
    socket.on('data', (d) => done(String(d).startsWith('+PONG')));
    socket.on('connect', () => socket.write('PING\r\n'));
  });
}

// redis-server on 127.0.0.1:port (a free one unless given); resolves once it answers PING.
// redis.stop() kills it as a crash would; redis.pause() / redis.resume() stop and continue it
// (SIGSTOP / SIGCONT: connections stay open, nothing answers).
export async function startRedis(port) {
  if (!haveRedis) throw new Error('redis-server is not installed (deploy/install-deps.sh installs it)');
  port ??= await freePort();
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '',
    '--appendonly', 'no', '--dir', makeStateDir()], { stdio: ['ignore', 'pipe', 'pipe'] });
  const redis = { child, port, log: '', exited: new Promise((r) => child.on('exit', r)) };
  child.stdout.on('data', (d) => { redis.log += d; });
  child.stderr.on('data', (d) => { redis.log += d; });
  redis.stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');  // as a crash
    await redis.exited;
  };
  redis.pause = () => child.kill('SIGSTOP');
  redis.resume = () => child.kill('SIGCONT');
  const deadline = Date.now() + 20000;
  while (!(await ping(port))) {
    if (child.exitCode !== null) throw new Error(`redis-server exited:\n${redis.log}`);
    if (Date.now() > deadline) { await redis.stop(); throw new Error(`redis-server did not answer:\n${redis.log}`); }
    await sleep(50);
  }
  return redis;
}
