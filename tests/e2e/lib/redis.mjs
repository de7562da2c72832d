// Starts a redis-server on a free loopback port (no persistence) and stops it; redis-cli calls.
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import net from 'node:net';

export const HAVE_REDIS = spawnSync('sh', ['-c', 'command -v redis-server && command -v redis-cli']).status === 0;

export async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

export async function startRedis({ port, password = '' } = {}) {
  port = port ?? await freePort();
  const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--loglevel', 'warning'];
  if (password) args.push('--requirepass', password);
  const proc = spawn('redis-server', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  const exited = new Promise((resolve) => proc.on('exit', resolve));
  const cli = (...cmd) => execFileSync('redis-cli', ['-p', String(port), ...(password ? ['-a', password, '--no-auth-warning'] : []), ...cmd],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  for (let i = 0; i < 200; i++) {
    try { if (cli('PING') === 'PONG') break; } catch { /* not up yet */ }
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    port,
    url: `redis://${password ? ':' + password + '@' : ''}127.0.0.1:${port}/0`,
    cli,
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      proc.kill('SIGKILL');
      await exited;
    },
  };
}
