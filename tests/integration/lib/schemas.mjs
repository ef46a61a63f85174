// The JSON Schema corpus the constrained-decoding tests generate against (response_format in
// structured.test.mjs, tool parameters in tool_choice.test.mjs), an independent validator for it
// (ajv's 2020-12 dialect, the one the server reads, with ajv-formats), and a helper that runs
// requests a batch at a time.
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

// Nested objects, arrays, enums, numbers with bounds, required and optional properties, anyOf,
// $ref (recursive too), formats. Strings and arrays are bounded so that a small model finishes
// within its context.
export const corpus = [
  { type: 'object', properties: { name: { type: 'string', maxLength: 8 }, age: { type: 'integer', minimum: 0, maximum: 120 } },
    required: ['name', 'age'], additionalProperties: false },
  { type: 'object', properties: {
    user: { type: 'object', properties: { id: { type: 'integer', exclusiveMinimum: 0 }, admin: { type: 'boolean' } },
      required: ['id'], additionalProperties: false },
    tags: { type: 'array', items: { type: 'string', enum: ['red', 'green', 'blue'] }, minItems: 1, maxItems: 3 } },
  required: ['user', 'tags'], additionalProperties: false },
  { type: 'object', properties: { score: { type: 'number', minimum: -1.5, exclusiveMaximum: 2.25 },
    level: { enum: ['low', 'mid', 'high', 3, null] } }, required: ['score', 'level'] },
  { anyOf: [
    { type: 'object', properties: { kind: { const: 'point' }, x: { type: 'integer', minimum: -9, maximum: 9 } },
      required: ['kind', 'x'], additionalProperties: false },
    { type: 'object', properties: { kind: { const: 'none' } }, required: ['kind'], additionalProperties: false }] },
  { $defs: { node: { type: 'object', properties: { v: { type: 'integer', minimum: 0, maximum: 99 },
    next: { anyOf: [{ $ref: '#/$defs/node' }, { type: 'null' }] } }, required: ['v', 'next'], additionalProperties: false } },
  $ref: '#/$defs/node' },
  { type: 'object', properties: { when: { type: 'string', format: 'date' }, id: { type: 'string', format: 'uuid' },
    note: { type: ['string', 'null'], maxLength: 6 } }, required: ['when', 'id', 'note'], additionalProperties: false },
  { type: 'array', prefixItems: [{ type: 'integer', minimum: 1, maximum: 5 }, { type: 'string', maxLength: 4 }],
    items: false, minItems: 2 },
  { type: 'object', properties: { a: { type: 'string', maxLength: 5 }, b: { type: 'integer', minimum: 10, maximum: 20 },
    c: { type: 'array', items: { type: 'number', minimum: 0, maximum: 1 }, maxItems: 2 } }, additionalProperties: false },
];

export const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);

// A validator per schema of the corpus, in its order.
export const validators = corpus.map((schema) => ajv.compile(schema));

// Why `text` is not a JSON value valid against validators[which], or null when it is.
export function invalidity(which, text) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    return `not JSON (${error.message}): ${text}`;
  }
  if (!validators[which](value)) return `${ajv.errorsText(validators[which].errors)}: ${text}`;
  return null;
}

// Runs `count` requests `width` at a time: run(i) for each i, results in order.
export async function inBatches(count, width, run) {
  const results = [];
  for (let begin = 0; begin < count; begin += width) {
    const batch = [];
    for (let i = begin; i < Math.min(count, begin + width); i++) batch.push(run(i));
    results.push(...await Promise.all(batch));
  }
  return results;
}
