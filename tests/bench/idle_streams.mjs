// Opens N streamed completions on one server, each on its own connection, and holds them open
// until stdin closes or SIGTERM arrives. Prints "open N" once every stream has its 200 and SSE
// headers (the server answers a queued request's headers at once and writes nothing more while
// the request waits). Used by tests/bench/gateway.sh to measure memory per open idle stream.
//
//   node idle_streams.mjs BASE_URL API_KEY MODEL N
import http from 'node:http';

const [baseUrl, key, model, countText] = process.argv.slice(2);
const count = Number(countText);
const url = new URL('/v1/completions', baseUrl);
const body = JSON.stringify({ model, prompt: 'Once upon a time', max_tokens: 8, stream: true });
const requests = [];
let open = 0;
let failed = 0;

function report() {
  if (open + failed === count) {
    console.log(failed === 0 ? `open ${open}` : `failed ${failed} of ${count}`);
  }
}

for (let i = 0; i < count; i += 1) {
  const req = http.request(url, {
    method: 'POST',
    agent: false,
    headers: {
      authorization: `Bearer ${key}`,
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(body),
    },
  }, (res) => {
    if (res.statusCode === 200) open += 1;
    else failed += 1;
    res.on('data', () => {});
    report();
  });
  req.on('error', () => { failed += 1; report(); });
  req.end(body);
  requests.push(req);
}

function close() {
  for (const req of requests) req.destroy();
  process.exit(0);
}
process.on('SIGTERM', close);
process.stdin.on('end', close);
process.stdin.resume();
