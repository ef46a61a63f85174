// What tests read from /metrics: the value of one series of Prometheus text, named with the
// labels it must carry, from a scrape of a server.
//
// A sample matches when its labels include every one of `labels` (other labels may be there
// too); the value is the sum of the samples that match. A counter with labels appears on
// /metrics only once it is first used, so seriesValue and metric read a series that is not
// there as 0. Where a test needs the series to be there (a value it checks, or a check that
// would hold vacuously without it: a gauge expected at 0, an upper bound on a counter), it
// reads with requiredSeriesValue or requiredMetric, which fail the test when no sample matches.
import assert from 'node:assert/strict';
import http from 'node:http';

// The series as the text format writes it, for messages: name{a="1",b="2"}.
function spelled(name, labels) {
  const pairs = Object.entries(labels).map(([k, v]) => `${k}=${JSON.stringify(String(v))}`);
  return pairs.length === 0 ? name : `${name}{${pairs.join(',')}}`;
}

// A sample value of the text format: a float, or NaN, +Inf, -Inf.
function sampleValue(text, line) {
  if (text === '+Inf' || text === 'Inf') return Infinity;
  if (text === '-Inf') return -Infinity;
  if (text === 'NaN') return NaN;
  const value = Number(text);
  assert.ok(text !== undefined && text !== '' && !Number.isNaN(value), `no sample value in /metrics line: ${line}`);
  return value;
}

// The labels of a sample line, `name{a="x",b="y\"z"} 1`, from the `{` at `start`: the labels
// unescaped, and the index just past the `}`.
function sampleLabels(line, start) {
  const labels = {};
  let i = start + 1;
  for (;;) {
    while (line[i] === ' ' || line[i] === ',') i++;
    if (line[i] === '}') return { labels, end: i + 1 };
    const eq = line.indexOf('=', i);
    assert.ok(eq > i && line[eq + 1] === '"', `malformed labels in /metrics line: ${line}`);
    const key = line.slice(i, eq).trim();
    let value = '';
    for (i = eq + 2; line[i] !== '"'; i++) {
      assert.ok(i < line.length, `unterminated label value in /metrics line: ${line}`);
      if (line[i] === '\\') {
        i++;
        value += line[i] === 'n' ? '\n' : line[i];
      } else {
        value += line[i];
      }
    }
    labels[key] = value;
    i++;
  }
}

// The values of the samples of `name` in `text` whose labels include all of `labels`.
function matchingSamples(text, name, labels) {
  const wanted = Object.entries(labels).map(([k, v]) => [k, String(v)]);
  const values = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const after = line[name.length];
    if (after !== ' ' && after !== '{') continue;  // another series whose name begins with this one
    let rest = name.length;
    let have = {};
    if (after === '{') ({ labels: have, end: rest } = sampleLabels(line, name.length));
    if (!wanted.every(([k, v]) => have[k] === v)) continue;
    const [value] = line.slice(rest).trim().split(/\s+/);  // a timestamp may follow
    values.push(sampleValue(value, line));
  }
  return values;
}

// The value of a series in Prometheus text: the sum of the samples of `name` whose labels
// include `labels`; 0 when none does.
export function seriesValue(text, name, labels = {}) {
  return matchingSamples(text, name, labels).reduce((sum, v) => sum + v, 0);
}

// seriesValue, for a series that must be there: fails the test when no sample matches.
export function requiredSeriesValue(text, name, labels = {}) {
  const values = matchingSamples(text, name, labels);
  assert.ok(values.length > 0, `no ${spelled(name, labels)} in /metrics`);
  return values.reduce((sum, v) => sum + v, 0);
}

// The text of a server's /metrics (`server.url`), which must answer 200. Each scrape has a
// connection of its own that the server closes once it has answered, so that scrapes leave
// no connection open behind them: tests count the server's open connections.
export function scrape(server) {
  const url = new URL('/metrics', server.url);
  return new Promise((resolve, reject) => {
    const req = http.get(url, { agent: false, headers: { connection: 'close' } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('error', reject);
      res.on('end', () => {
        if (res.statusCode === 200) resolve(text);
        else reject(new Error(`GET ${url}: ${res.statusCode} ${text}`));
      });
    });
    req.on('error', reject);
  });
}

// seriesValue of a fresh scrape of `server`.
export async function metric(server, name, labels = {}) {
  return seriesValue(await scrape(server), name, labels);
}

// requiredSeriesValue of a fresh scrape of `server`.
export async function requiredMetric(server, name, labels = {}) {
  return requiredSeriesValue(await scrape(server), name, labels);
}
