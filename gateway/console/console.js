// The admin console: a client of the admin API (/admin/v1/) in the browser. The admin token
// lives in this tab's session storage only and goes out as a bearer token with each call (no
// cookie: another site's page cannot make the browser send it). Every text that comes from the
// server is put on the page as text, never as markup.
const TOKEN_KEY = 'edgeinfer-admin-token';
const main = document.getElementById('main');
const nav = document.getElementById('nav');
const statusLine = document.getElementById('status');
let quotaKinds = null;  // GET /admin/v1/quota-kinds, once per sign-in
let refreshTimer = null;

// ---- helpers -----------------------------------------------------------------------------------

// An element: h('td', { class: 'number' }, 'text', child, ...). Attributes starting with "on"
// are listeners; the rest are attributes. Strings become text nodes.
function h(tag, attributes = {}, ...children) {
  const svg = ['svg', 'rect', 'text', 'line', 'title', 'g'].includes(tag);
  const el = svg ? document.createElementNS('http://www.w3.org/2000/svg', tag) : document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on')) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function say(message, { error = false } = {}) {
  statusLine.replaceChildren(message ? h('p', { class: error ? 'notice error' : 'notice' }, message) : '');
}

const token = () => sessionStorage.getItem(TOKEN_KEY);

// One call of the admin API: { status, json }. A 401 signs out (the token was changed on the
// server), except for the call that tries a token at sign-in.
async function api(method, path, body, { trying = false } = {}) {
  const headers = { authorization: `Bearer ${token()}` };
  if (body !== undefined) headers['content-type'] = 'application/json';
  let res;
  try {
    res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    return { status: 0, json: { error: { message: `The server cannot be reached: ${e.message}` } } };
  }
  const text = await res.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch { json = { error: { message: text } }; }
  if (res.status === 401 && !trying) {
    signOut('The admin token was refused. Sign in again.');
  }
  return { status: res.status, json };
}

const errorMessage = (answer) => answer.json?.error?.message ?? `The server answered ${answer.status}`;

function formatNumber(n) {
  return typeof n === 'number' ? n.toLocaleString('en-US') : String(n);
}

function formatBytes(n) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1 && value % 1024 === 0) { value /= 1024; unit += 1; }
  return `${formatNumber(value)} ${units[unit]}`;
}

function formatQuota(kind, value) {
  if (value === null || value === undefined) return 'unlimited';
  return kind.unit === 'bytes' ? formatBytes(value) : formatNumber(value);
}

const formatTime = (unixSeconds) => (unixSeconds ? new Date(unixSeconds * 1000).toISOString().replace('.000Z', 'Z') : '—');
const title = (name) => name.replaceAll('_', ' ').replace(/^./, (c) => c.toUpperCase()).replace(/^Kv /, 'KV ');
const utcDay = (date) => date.toISOString().slice(0, 10);

async function loadQuotaKinds() {
  if (quotaKinds) return quotaKinds;
  const answer = await api('GET', '/admin/v1/quota-kinds');
  if (answer.status !== 200) throw new Error(errorMessage(answer));
  quotaKinds = answer.json.data;
  return quotaKinds;
}

// Marks the input an API error names (param "quotas.daily_tokens", "weight", "id") and focuses it.
function markInvalid(form, answer) {
  for (const input of form.querySelectorAll('[aria-invalid]')) input.removeAttribute('aria-invalid');
  const param = answer.json?.error?.param;
  const field = param ? form.querySelector(`[name="${CSS.escape(param)}"]`) : null;
  const message = form.querySelector('.form-error');
  message.textContent = errorMessage(answer);
  if (field) {
    field.setAttribute('aria-invalid', 'true');
    field.setAttribute('aria-describedby', message.id);
    field.focus();
  } else {
    message.focus();
  }
}

// The quota inputs of a form: one per kind, empty meaning unlimited.
function quotaInputs(kinds, values = {}) {
  return kinds.map((kind) => h('label', {},
    title(kind.name),
    h('small', {}, `${kind.help}${kind.unit === 'bytes' ? ' (bytes)' : ''}; empty: unlimited`),
    h('input', { name: `quotas.${kind.name}`, inputmode: 'numeric', autocomplete: 'off',
      value: values[kind.name] ?? '', placeholder: 'unlimited' })));
}

// The quotas object of a form: a number for each filled input, null for an emptied one (when
// `withNulls`, as a PATCH removes a limit with null). A value that is not a whole number is sent
// as it is, for the API to refuse by name.
function readQuotas(form, kinds, withNulls) {
  const quotas = {};
  for (const kind of kinds) {
    const raw = form.elements[`quotas.${kind.name}`].value.trim();
    if (raw === '') {
      if (withNulls) quotas[kind.name] = null;
    } else {
      quotas[kind.name] = /^-?\d+$/.test(raw) ? Number(raw) : raw;
    }
  }
  return quotas;
}

function show(...children) {
  clearInterval(refreshTimer);
  refreshTimer = null;
  main.replaceChildren(...children);
  main.focus();
  const here = location.hash.split('/').slice(0, 2).join('/');
  for (const link of nav.querySelectorAll('a')) {
    if (link.getAttribute('href') === here) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
}

// ---- sign in and out ---------------------------------------------------------------------------

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  quotaKinds = null;
  nav.hidden = true;
  if (location.hash !== '#/signin') location.hash = '#/signin';
  else route();
  say(message ?? 'Signed out.');
}

function signInView() {
  nav.hidden = true;
  const error = h('p', { class: 'error form-error', id: 'signin-error', tabindex: '-1' });
  const form = h('form', {
    onsubmit: async (event) => {
      event.preventDefault();
      const value = form.elements.token.value.trim();
      if (!value) { error.textContent = 'Enter the admin token.'; return; }
      sessionStorage.setItem(TOKEN_KEY, value);
      const answer = await api('GET', '/admin/v1/tenants', undefined, { trying: true });
      if (answer.status === 200) {
        say('');
        location.hash = '#/tenants';
        return;
      }
      sessionStorage.removeItem(TOKEN_KEY);
      error.textContent = answer.status === 401
        ? 'That is not this server\'s admin token.'
        : errorMessage(answer);
      form.elements.token.setAttribute('aria-invalid', 'true');
      form.elements.token.focus();
    },
  },
  h('label', {}, 'Admin token', h('small', {}, 'The server\'s --admin-token (EDGE_ADMIN_TOKEN). Kept in this tab only.'),
    h('input', { name: 'token', type: 'password', autocomplete: 'current-password', required: true, 'aria-describedby': 'signin-error' })),
  error,
  h('button', { type: 'submit' }, 'Sign in'));
  show(h('section', { class: 'signin' }, h('h2', {}, 'Sign in'), form));
  form.elements.token.focus();
}

// ---- tenants -----------------------------------------------------------------------------------

async function tenantsView() {
  const kinds = await loadQuotaKinds();
  const answer = await api('GET', '/admin/v1/tenants');
  if (answer.status !== 200) { show(h('p', { class: 'error' }, errorMessage(answer))); return; }
  const tenants = answer.json.data;
  const table = h('table', {},
    h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Tenant'), h('th', { scope: 'col', class: 'number' }, 'Weight'),
      kinds.map((k) => h('th', { scope: 'col', class: 'number' }, title(k.name))),
      h('th', { scope: 'col' }, 'Created'))),
    h('tbody', {}, tenants.map((t) => h('tr', {},
      h('th', { scope: 'row' }, h('a', { href: `#/tenants/${encodeURIComponent(t.id)}` }, t.id)),
      h('td', { class: 'number' }, t.weight),
      kinds.map((k) => h('td', { class: 'number' }, formatQuota(k, t.quotas[k.name]))),
      h('td', {}, formatTime(t.created_at))))));

  const form = h('form', {
    class: 'grid',
    onsubmit: async (event) => {
      event.preventDefault();
      const body = { id: form.elements.id.value.trim(), quotas: readQuotas(form, kinds, false) };
      const weight = form.elements.weight.value.trim();
      if (weight !== '') body.weight = /^[\d.]+$/.test(weight) ? Number(weight) : weight;
      const created = await api('POST', '/admin/v1/tenants', body);
      if (created.status === 201) {
        say(`Tenant ${created.json.id} created.`);
        location.hash = `#/tenants/${encodeURIComponent(created.json.id)}`;
      } else {
        markInvalid(form, created);
      }
    },
  },
  h('label', {}, 'Tenant id', h('small', {}, 'Letters, digits, ".", "_", "-"'),
    h('input', { name: 'id', required: true, autocomplete: 'off' })),
  h('label', {}, 'Weight', h('small', {}, 'Share of the engine; empty: 1'), h('input', { name: 'weight', inputmode: 'decimal' })),
  quotaInputs(kinds),
  h('p', { class: 'error form-error', id: 'create-error', tabindex: '-1' }),
  h('div', {}, h('button', { type: 'submit' }, 'Create tenant')));

  show(h('h2', {}, 'Tenants'),
    tenants.length ? table : h('p', {}, 'No tenants yet.'),
    h('h3', {}, 'Create a tenant'), form);
}

// Today's figures and the last 30 days by day, from the hourly usage rows.
async function usageSection(id) {
  const now = new Date();
  const since = new Date(now.getTime() - 29 * 86400 * 1000);
  const figures = h('div', { class: 'figures' });
  const chartBox = h('div', {});
  const spendBox = h('div', {});
  const updated = h('p', { class: 'mono' });
  const refresh = async () => {
    const answer = await api('GET', `/admin/v1/tenants/${encodeURIComponent(id)}/usage?from=${utcDay(since)}`);
    if (answer.status !== 200) { updated.textContent = errorMessage(answer); return; }
    const today = utcDay(new Date());
    const byDay = new Map();
    for (let d = 0; d < 30; ++d) byDay.set(utcDay(new Date(since.getTime() + d * 86400 * 1000)), 0);
    const total = { requests: 0, prompt_tokens: 0, completion_tokens: 0, cached_tokens: 0, rejections: 0 };
    let thisHour = 0;
    const hourStart = new Date();
    hourStart.setUTCMinutes(0, 0, 0);
    for (const row of answer.json.data) {
      const day = row.hour.slice(0, 10);
      byDay.set(day, (byDay.get(day) ?? 0) + row.total_tokens);
      if (day === today) for (const key of Object.keys(total)) total[key] += row[key];
      if (Date.parse(row.hour) === hourStart.getTime()) thisHour = row.total_tokens;
    }
    const minutes = Math.max(1, (Date.now() - hourStart.getTime()) / 60000);
    const figure = (name, value) => h('div', { class: 'figure' }, h('div', { class: 'value' }, formatNumber(value)), h('div', { class: 'name' }, name));
    figures.replaceChildren(
      figure('tokens/min this hour', Math.round(thisHour / minutes)),
      figure('requests today', total.requests),
      figure('prompt tokens today', total.prompt_tokens),
      figure('cached tokens today', total.cached_tokens),
      figure('completion tokens today', total.completion_tokens),
      figure('rejections today', total.rejections));
    chartBox.replaceChildren(dayChart([...byDay.entries()]));
    const spend = await api('GET', `/admin/v1/tenants/${encodeURIComponent(id)}/spend?from=${utcDay(since)}`);
    if (spend.status === 200) spendBox.replaceChildren(spendTable(spend.json.data));
    updated.textContent = `Updated ${new Date().toISOString().slice(11, 19)} UTC (every 5 s)`;
  };
  await refresh();
  return { section: h('section', { 'aria-labelledby': 'usage-heading' }, h('h3', { id: 'usage-heading' }, 'Usage'),
    figures, h('h3', {}, 'Tokens per day (UTC), last 30 days'), chartBox,
    h('h3', {}, 'Spend by key, model and API, last 30 days'), spendBox, updated), refresh };
}

function spendTable(rows) {
  if (!rows.length) return h('p', {}, 'No requests served in these 30 days.');
  const columns = ['requests', 'prompt_tokens', 'cached_tokens', 'completion_tokens', 'total_tokens'];
  return h('table', { class: 'spend' },
    h('thead', {}, h('tr', {}, ['Key', 'Model', 'API'].map((c) => h('th', { scope: 'col' }, c)),
      columns.map((c) => h('th', { scope: 'col', class: 'number' }, title(c))))),
    h('tbody', {}, rows.map((r) => h('tr', {},
      h('td', { class: 'mono' }, r.key_id), h('td', {}, r.model), h('td', {}, r.api),
      columns.map((c) => h('td', { class: 'number' }, formatNumber(r[c])))))));
}

function dayChart(days) {
  const width = 900;
  const height = 220;
  const left = 60;
  const bottom = 30;
  const top = 10;
  const max = Math.max(1, ...days.map(([, v]) => v));
  const step = (width - left - 10) / days.length;
  const y = (v) => top + (height - top - bottom) * (1 - v / max);
  const total = days.reduce((s, [, v]) => s + v, 0);
  const svg = h('svg', { class: 'chart', viewBox: `0 0 ${width} ${height}`, role: 'img',
    'aria-label': `Tokens per day over the last 30 days: ${formatNumber(total)} in all, at most ${formatNumber(max)} in a day` },
  h('line', { class: 'grid', x1: left, x2: width - 10, y1: y(0), y2: y(0) }),
  h('line', { class: 'grid', x1: left, x2: width - 10, y1: y(max), y2: y(max) }),
  h('text', { class: 'axis', x: left - 6, y: y(max) + 4, 'text-anchor': 'end' }, formatNumber(max)),
  h('text', { class: 'axis', x: left - 6, y: y(0) + 4, 'text-anchor': 'end' }, '0'),
  days.map(([day, value], i) => h('g', {},
    h('rect', { class: 'bar', x: left + i * step + 2, y: y(value), width: Math.max(1, step - 4), height: y(0) - y(value) },
      h('title', {}, `${day}: ${formatNumber(value)} tokens`)),
    i % 5 === 0 || i === days.length - 1
      ? h('text', { class: 'axis', x: left + i * step + step / 2, y: height - 10, 'text-anchor': 'middle' }, day.slice(5))
      : null)));
  return svg;
}

async function keysSection(id) {
  const section = h('section', { 'aria-labelledby': 'keys-heading' });
  const render = async (issued) => {
    const answer = await api('GET', `/admin/v1/tenants/${encodeURIComponent(id)}/keys`);
    if (answer.status !== 200) { section.replaceChildren(h('p', { class: 'error' }, errorMessage(answer))); return; }
    const keys = answer.json.data;
    const table = h('table', {},
      h('thead', {}, h('tr', {}, ['Key id', 'Status', 'Created', 'Expires', 'Revoked', ''].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, keys.map((k) => h('tr', {},
        h('td', { class: 'mono' }, k.id), h('td', {}, k.status), h('td', {}, formatTime(k.created_at)),
        h('td', {}, formatTime(k.expires_at)), h('td', {}, formatTime(k.revoked_at)),
        h('td', {}, k.status === 'revoked' ? '' : h('button', {
          type: 'button', class: 'danger', 'aria-label': `Revoke key ${k.id}`,
          onclick: async () => {
            if (!confirm(`Revoke key ${k.id}? Requests with it are refused from now on.`)) return;
            const revoked = await api('DELETE', `/admin/v1/keys/${encodeURIComponent(k.id)}`);
            say(revoked.status === 200 ? `Key ${k.id} revoked.` : errorMessage(revoked), { error: revoked.status !== 200 });
            await render();
          },
        }, 'Revoke'))))));
    const form = h('form', {
      class: 'grid',
      onsubmit: async (event) => {
        event.preventDefault();
        const days = form.elements.expires_in.value.trim();
        const body = days === '' ? {} : { expires_in: /^\d+$/.test(days) ? Number(days) * 86400 : days };
        const created = await api('POST', `/admin/v1/tenants/${encodeURIComponent(id)}/keys`, body);
        if (created.status === 201) await render(created.json);
        else markInvalid(form, created);
      },
    },
    h('label', {}, 'Expires in (days)', h('small', {}, 'Empty: never'), h('input', { name: 'expires_in', inputmode: 'numeric', id: 'key-days' })),
    h('p', { class: 'error form-error', id: 'key-error', tabindex: '-1' }),
    h('div', {}, h('button', { type: 'submit' }, 'Create key')));
    let secret = null;
    if (issued) {
      const code = h('code', { id: 'new-key' }, issued.key);
      secret = h('div', { class: 'secret', role: 'alert' },
        h('span', {}, 'New key, shown this once:'), code,
        h('button', { type: 'button', class: 'secondary', onclick: async (event) => {
          try {
            await navigator.clipboard.writeText(issued.key);
            event.target.textContent = 'Copied';
          } catch {
            getSelection().selectAllChildren(code);
            event.target.textContent = 'Selected: press Ctrl+C';
          }
        } }, 'Copy'));
    }
    section.replaceChildren(h('h3', { id: 'keys-heading' }, 'API keys'), secret,
      keys.length ? table : h('p', {}, 'No keys.'), h('h4', {}, 'Create a key'), form);
    if (secret) secret.querySelector('button').focus();
  };
  await render();
  return section;
}

async function tenantView(id) {
  const kinds = await loadQuotaKinds();
  const answer = await api('GET', `/admin/v1/tenants/${encodeURIComponent(id)}`);
  if (answer.status !== 200) { show(h('h2', {}, id), h('p', { class: 'error' }, errorMessage(answer))); return; }
  const tenant = answer.json;
  const form = h('form', {
    class: 'grid',
    onsubmit: async (event) => {
      event.preventDefault();
      const body = { quotas: readQuotas(form, kinds, true) };
      const weight = form.elements.weight.value.trim();
      body.weight = /^[\d.]+$/.test(weight) ? Number(weight) : weight;
      const updated = await api('PATCH', `/admin/v1/tenants/${encodeURIComponent(id)}`, body);
      if (updated.status === 200) {
        say(`Quotas of ${id} saved.`);
        for (const input of form.querySelectorAll('[aria-invalid]')) input.removeAttribute('aria-invalid');
        form.querySelector('.form-error').textContent = '';
      } else {
        markInvalid(form, updated);
      }
    },
  },
  h('label', {}, 'Weight', h('small', {}, 'Share of the engine relative to other tenants'),
    h('input', { name: 'weight', inputmode: 'decimal', value: tenant.weight })),
  quotaInputs(kinds, tenant.quotas),
  h('p', { class: 'error form-error', id: 'quota-error', tabindex: '-1' }),
  h('div', {}, h('button', { type: 'submit' }, 'Save quotas')));

  const usage = await usageSection(id);
  const keys = await keysSection(id);
  const remove = h('button', {
    type: 'button', class: 'danger',
    onclick: async () => {
      if (!confirm(`Delete tenant ${id} and its keys? Its usage stays as history.`)) return;
      const deleted = await api('DELETE', `/admin/v1/tenants/${encodeURIComponent(id)}`);
      if (deleted.status === 204 || deleted.status === 200) {
        say(`Tenant ${id} deleted.`);
        location.hash = '#/tenants';
      } else {
        say(errorMessage(deleted), { error: true });
      }
    },
  }, 'Delete tenant');
  show(h('p', {}, h('a', { href: '#/tenants' }, '← All tenants')),
    h('h2', {}, `Tenant ${id}`),
    usage.section,
    h('section', { 'aria-labelledby': 'quota-heading' }, h('h3', { id: 'quota-heading' }, 'Quotas'), form),
    keys,
    h('section', {}, h('h3', {}, 'Delete'), remove));
  refreshTimer = setInterval(usage.refresh, 5000);
}

// ---- audit log ---------------------------------------------------------------------------------

async function auditView() {
  const entries = [];
  let before = null;
  for (let page = 0; page < 5; ++page) {  // the newest 1,000 entries at most
    const answer = await api('GET', `/admin/v1/audit?limit=200${before ? `&before=${before}` : ''}`);
    if (answer.status !== 200) { show(h('h2', {}, 'Audit log'), h('p', { class: 'error' }, errorMessage(answer))); return; }
    entries.push(...answer.json.data);
    if (!answer.json.has_more || answer.json.data.length === 0) break;
    before = answer.json.data.at(-1).id;
  }
  const actions = [...new Set(entries.map((e) => e.action))].sort();
  const action = h('select', { name: 'action' }, h('option', { value: '' }, 'All actions'), actions.map((a) => h('option', { value: a }, a)));
  const target = h('input', { name: 'target', type: 'search', placeholder: 'tenant or key id' });
  const body = h('tbody', {});
  const render = () => {
    const wanted = entries.filter((e) => (!action.value || e.action === action.value) &&
      (!target.value || e.target.includes(target.value.trim())));
    body.replaceChildren(...wanted.map((e) => h('tr', {},
      h('td', {}, formatTime(e.at)), h('td', {}, e.action), h('td', { class: 'mono' }, e.target),
      h('td', {}, e.actor), h('td', { class: 'mono' }, e.request_id ?? '—'),
      h('td', { class: 'mono' }, JSON.stringify(e.details).slice(0, 160)))));
    count.textContent = `${wanted.length} of ${entries.length} entries`;
  };
  const count = h('p', { 'aria-live': 'polite' });
  action.addEventListener('change', render);
  target.addEventListener('input', render);
  show(h('h2', {}, 'Audit log'),
    h('div', { class: 'filters' }, h('label', {}, 'Action', action), h('label', {}, 'Target', target)),
    count,
    h('table', {}, h('thead', {}, h('tr', {}, ['Time (UTC)', 'Action', 'Target', 'Actor', 'Request id', 'Details']
      .map((c) => h('th', { scope: 'col' }, c)))), body));
  render();
}

// ---- routing -----------------------------------------------------------------------------------

async function route() {
  const [, page, id] = location.hash.split('/');
  if (!token() || page === 'signin' || !page) {
    if (!token()) { signInView(); return; }
    location.hash = '#/tenants';
    return;
  }
  nav.hidden = false;
  try {
    if (page === 'tenants' && id) await tenantView(decodeURIComponent(id));
    else if (page === 'audit') await auditView();
    else await tenantsView();
  } catch (e) {
    show(h('p', { class: 'error' }, e.message));
  }
}

document.getElementById('sign-out').addEventListener('click', () => signOut());
window.addEventListener('hashchange', route);
route();
