// The admin console in a real browser (Debian's Chromium driven by playwright-core), against a
// real server: every page, by keyboard where a user would type, with the checks a demanding
// admin would make: sign in (a wrong token refused), create a tenant (a validation error from
// the API shown on its field), set quotas, create a key (shown once, with a copy button), see a
// request made with it appear in the usage, revoke it (refused from then on), read the audit log
// with a filter, sign out (the token gone from the tab). The page runs under a strict
// Content-Security-Policy with no inline script; any console error or policy violation fails
// the test. Screenshots of each page go to build/test-artifacts/console/ (EDGE_ARTIFACTS_DIR).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startServer } from './lib/server.mjs';

const ADMIN_TOKEN = 'console-admin-token-0123456789';
const artifacts = path.resolve(process.env.EDGE_ARTIFACTS_DIR ?? 'build/test-artifacts', 'console');
let server;
let browser;

before(async () => {
  fs.mkdirSync(artifacts, { recursive: true });
  server = await startServer(['--threads', '1', '--http-threads', '2', '--kv-cache-memory', '16MiB',
    '--admin-token', ADMIN_TOKEN]);
  const { chromium } = await import('playwright-core');
  browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

test('the console is served with a strict policy and no inline code', async () => {
  const res = await fetch(`${server.url}/admin/`);
  assert.equal(res.status, 200);
  const html = await res.text();
  const policy = res.headers.get('content-security-policy');
  assert.match(policy, /default-src 'none'/);
  assert.match(policy, /script-src 'self'(;|$)/);
  assert.doesNotMatch(policy, /unsafe-inline|unsafe-eval/);
  assert.match(policy, /frame-ancestors 'none'/);
  assert.equal(res.headers.get('x-content-type-options'), 'nosniff');
  assert.doesNotMatch(html, /<script(?![^>]*\bsrc=)[^>]*>/, 'an inline script');
  assert.doesNotMatch(html, /\son[a-z]+=/, 'an inline event handler');
  assert.doesNotMatch(html, /\sstyle=/, 'an inline style');
  for (const file of ['console.js', 'console.css']) {
    const asset = await fetch(`${server.url}/admin/${file}`);
    assert.equal(asset.status, 200, file);
    assert.match(asset.headers.get('content-type'), file.endsWith('.js') ? /text\/javascript/ : /text\/css/);
  }
  assert.equal((await fetch(`${server.url}/admin/other.js`)).status, 404);
});

test('an admin runs a tenant from the browser: sign in, create, quotas, keys, usage, revoke, audit, sign out', async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const problems = [];
  // Errors on the page's console, but for the answers the test provokes on purpose (a wrong
  // token's 401, an invalid quota's 400), which Chromium logs as failed loads.
  page.on('console', (m) => {
    if (m.type() === 'error' && !/status of (400|401) /.test(m.text())) problems.push(m.text());
  });
  page.on('pageerror', (e) => problems.push(e.message));
  page.on('dialog', (d) => d.accept());
  const shot = (name) => page.screenshot({ path: path.join(artifacts, `${name}.png`), fullPage: true });

  // Sign in, by keyboard: a wrong token first.
  await page.goto(`${server.url}/admin/`);
  await page.getByLabel('Admin token').waitFor();
  await shot('1-sign-in');
  await page.getByLabel('Admin token').fill('not-the-token-at-all');
  await page.keyboard.press('Enter');
  await page.getByText('That is not this server\'s admin token.').waitFor();
  assert.equal(await page.evaluate(() => sessionStorage.length), 0);
  await page.getByLabel('Admin token').fill(ADMIN_TOKEN);
  await page.keyboard.press('Enter');
  await page.getByRole('heading', { name: 'Tenants' }).waitFor();
  // The first start's tenant is listed.
  await page.getByRole('link', { name: 'default' }).waitFor();
  assert.equal(await page.evaluate(() => document.cookie), '');

  // A validation error from the API, on its field.
  await page.getByLabel('Tenant id').fill('acme');
  await page.locator('input[name="quotas.daily_tokens"]').fill('-5');
  await page.getByRole('button', { name: 'Create tenant' }).click();
  const invalid = page.locator('input[name="quotas.daily_tokens"][aria-invalid="true"]');
  await invalid.waitFor();
  const message = await page.locator('#create-error').textContent();
  assert.match(message, /daily_tokens/);
  await shot('2-validation-error');

  // Created with quotas.
  await page.locator('input[name="quotas.daily_tokens"]').fill('1000000');
  await page.locator('input[name="quotas.requests_per_minute"]').fill('600');
  await page.getByRole('button', { name: 'Create tenant' }).click();
  await page.getByRole('heading', { name: 'Tenant acme' }).waitFor();

  // Quotas changed and saved, as the API holds them.
  await page.locator('input[name="quotas.tokens_per_minute"]').fill('50000');
  await page.locator('input[name="quotas.requests_per_minute"]').fill('');
  await page.getByRole('button', { name: 'Save quotas' }).click();
  await page.getByText('Quotas of acme saved.').waitFor();
  const stored = await (await fetch(`${server.url}/admin/v1/tenants/acme`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })).json();
  assert.equal(stored.quotas.tokens_per_minute, 50000);
  assert.equal(stored.quotas.requests_per_minute, null);
  assert.equal(stored.quotas.daily_tokens, 1000000);

  // A key, shown once with a copy button.
  await page.getByRole('button', { name: 'Create key' }).click();
  const shown = page.locator('#new-key');
  await shown.waitFor();
  const key = (await shown.textContent()).trim();
  assert.match(key, /^ek-[0-9a-f]{16}\.[A-Za-z0-9_-]{43}$/);
  await page.getByRole('button', { name: 'Copy' }).click();
  await shot('3-new-key');

  // A request with it shows in the usage within the page's refresh.
  const completion = await fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 8, temperature: 0 }),
  });
  assert.equal(completion.status, 200);
  const usage = (await completion.json()).usage;
  const requests = page.locator('.figure', { hasText: 'requests today' }).locator('.value');
  await page.waitForFunction(() => document.querySelector('.figure .value') !== null);
  for (let i = 0; i < 40 && (await requests.textContent()) !== '1'; ++i) await page.waitForTimeout(250);
  assert.equal(await requests.textContent(), '1');
  const completionTokens = page.locator('.figure', { hasText: 'completion tokens today' }).locator('.value');
  assert.equal(await completionTokens.textContent(), String(usage.completion_tokens));
  assert.equal(await page.locator('svg.chart rect.bar').count(), 30);
  // The spend view: the key's row, with the model and the API the request used.
  const spendRow = page.locator('table.spend tbody tr');
  await spendRow.first().waitFor();
  assert.equal(await spendRow.count(), 1);
  const cells = await spendRow.first().locator('td').allTextContents();
  assert.equal(cells[0], key.slice(3, 19));
  assert.equal(cells[2], 'completions');
  assert.equal(cells[3], '1');
  assert.equal(cells[7], String(usage.prompt_tokens + usage.completion_tokens));
  await shot('4-tenant');

  // Revoked: the key is refused from then on.
  await page.getByRole('button', { name: /^Revoke key / }).click();
  await page.getByText(/Key [0-9a-f]{16} revoked\./).waitFor();
  const refused = await fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'x', max_tokens: 1 }),
  });
  assert.equal(refused.status, 401);

  // The audit log, filtered.
  await page.getByRole('link', { name: 'Audit log' }).click();
  await page.getByRole('heading', { name: 'Audit log' }).waitFor();
  await page.getByLabel('Action').selectOption('key.revoke');
  const rows = page.locator('tbody tr');
  assert.equal(await rows.count(), 1);
  assert.match(await rows.first().textContent(), /key\.revoke/);
  await page.getByLabel('Action').selectOption('');
  assert.ok(await rows.count() >= 5);
  await shot('5-audit-log');

  // Sign out: the token leaves the tab.
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.getByLabel('Admin token').waitFor();
  assert.equal(await page.evaluate(() => sessionStorage.length), 0);
  assert.deepEqual(problems, []);
  await page.close();
});
