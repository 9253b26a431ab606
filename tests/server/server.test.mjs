// dsflash serve against the real clients (openai, @anthropic-ai/sdk) on a tiny random model: every endpoint,
// stream and non-stream, usage fields, prefix reuse across turns, bad requests, auth, queue limits, 16
// concurrent streams, client abort, /metrics and SIGTERM. The model's text is noise, so content is not checked
// here (tests/server/*.cpp drive reasoning and DSML output with scripted tokens).
// Env: DSFLASH_BIN (the dsflash binary), DSFLASH_TINY_MODEL (a make-tiny directory with tokenizer.json).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const BIN = process.env.DSFLASH_BIN;
const MODEL_DIR = process.env.DSFLASH_TINY_MODEL;
const MODEL = 'tiny-test';

// Starts `dsflash serve` on a free loopback port; resolves once /health is 200.
async function startServer(extra = []) {
  const child = spawn(BIN, ['serve', '-m', MODEL_DIR, '--host', '127.0.0.1', '--port', '0', '--served-name', MODEL,
                            '--threads', '2', ...extra], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => { stderr += d; });
  const url = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('no "listening on" line; stderr: ' + stderr)), 30000);
    child.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/\S+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    child.on('exit', (code) => reject(new Error(`serve exited ${code}: ${stderr}`)));
  });
  for (let i = 0; i < 300; i++) {
    const r = await fetch(url + '/health').catch(() => null);
    if (r && r.status === 200) break;
    await new Promise((r2) => setTimeout(r2, 100));
  }
  return { child, url, stderr: () => stderr };
}

function stop(server) {
  return new Promise((resolve) => {
    if (server.child.exitCode !== null) return resolve(server.child.exitCode);
    server.child.on('exit', (code) => resolve(code));
    server.child.kill('SIGTERM');
  });
}

async function metric(url, name) {
  const text = await (await fetch(url + '/metrics')).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' '));
  return line === undefined ? undefined : Number(line.split(' ')[1]);
}

let main;
let openai;
let anthropic;
const user = (content) => [{ role: 'user', content }];

before(async () => {
  assert.ok(BIN && MODEL_DIR, 'set DSFLASH_BIN and DSFLASH_TINY_MODEL');
  main = await startServer(['--ctx-size', '2048', '--alias', 'my-alias', '--max-body-mib', '1']);
  openai = new OpenAI({ baseURL: main.url + '/v1', apiKey: 'unused', maxRetries: 0 });
  anthropic = new Anthropic({ baseURL: main.url, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  if (main) assert.equal(await stop(main), 0, 'SIGTERM exits 0');
});

test('health and models', async () => {
  const health = await (await fetch(main.url + '/health')).json();
  assert.equal(health.status, 'ok');
  assert.equal(typeof health.prefix_cache, 'boolean');
  const models = await openai.models.list();
  const ids = models.data.map((m) => m.id);
  assert.deepEqual(ids, [MODEL, 'my-alias']);
});

test('openai chat, non-stream: usage fields', async () => {
  const r = await openai.chat.completions.create({ model: MODEL, messages: user('Hello'), max_tokens: 8, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 8);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 8);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
  assert.equal(typeof r.usage.completion_tokens_details.reasoning_tokens, 'number');
  assert.equal(r.usage.prompt_cache_hit_tokens + r.usage.prompt_cache_miss_tokens, r.usage.prompt_tokens);
});

test('openai chat, stream with include_usage, thinking off, logprobs', async () => {
  const stream = await openai.chat.completions.create({
    model: 'my-alias', messages: user('Hi'), max_tokens: 6, stream: true, stream_options: { include_usage: true },
    thinking: { type: 'disabled' }, logprobs: true, top_logprobs: 2, seed: 1, temperature: 0.7,
  });
  let chunks = 0, finish = null, usage = null, logprobs = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.choices.length) {
      if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
      logprobs += chunk.choices[0].logprobs?.content?.length ?? 0;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.ok(chunks >= 3);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 6);
  assert.equal(usage.completion_tokens_details.reasoning_tokens, 0);
  assert.equal(logprobs, 6);
});

test('openai completions, stream and non-stream', async () => {
  const r = await openai.completions.create({ model: MODEL, prompt: 'Once upon', max_tokens: 5, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.usage.completion_tokens, 5);
  const s = await openai.completions.create({ model: MODEL, prompt: 'Once upon', max_tokens: 5, temperature: 0, stream: true });
  let text = '', finish = null;
  for await (const c of s) {
    text += c.choices[0]?.text ?? '';
    if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
  }
  assert.equal(finish, 'length');
  assert.equal(text, r.choices[0].text, 'greedy: stream and non-stream agree');
});

test('anthropic messages, non-stream, stream, count_tokens', async () => {
  const m = await anthropic.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 6, system: 'Be brief.',
                                              messages: user('Hello'), temperature: 0 });
  assert.equal(m.type, 'message');
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.usage.output_tokens, 6);
  assert.ok(m.usage.input_tokens > 0);
  assert.equal(m.usage.cache_read_input_tokens, 0 + m.usage.cache_read_input_tokens);
  assert.equal(typeof m.usage.cache_creation_input_tokens, 'number');
  const count = await anthropic.messages.countTokens({ model: 'claude-sonnet-4-5', system: 'Be brief.', messages: user('Hello') });
  assert.equal(count.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);

  const stream = anthropic.messages.stream({ model: 'claude-x', max_tokens: 6, messages: user('Hi'),
                                             thinking: { type: 'enabled', budget_tokens: 1024 } },
                                           { headers: { 'anthropic-beta': 'interleaved-thinking-2025-05-14' } });
  const types = [];
  for await (const event of stream) types.push(event.type);
  const final = await stream.finalMessage();
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.ok(types.includes('content_block_start') && types.includes('content_block_delta'));
  assert.equal(final.stop_reason, 'max_tokens');
  assert.equal(final.usage.output_tokens, 6);
  assert.equal(final.content[0].type, 'thinking');
});

test('turn 2 re-renders turn 1 (prefix reuse)', async () => {
  const health = await (await fetch(main.url + '/health')).json();
  const messages = [{ role: 'system', content: 'You are terse.' }, ...user('Tell me a story about a long road.')];
  const turn1 = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 8, temperature: 0,
                                                      thinking: { type: 'disabled' } });
  messages.push(turn1.choices[0].message, ...user('And then?'));
  const turn2 = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 4, temperature: 0,
                                                      thinking: { type: 'disabled' } });
  assert.ok(turn2.usage.prompt_tokens > turn1.usage.prompt_tokens + 4);
  if (health.prefix_cache) {
    assert.ok(turn2.usage.prompt_tokens_details.cached_tokens >= turn1.usage.prompt_tokens - 64,
              'turn 2 hits the prefix cache for turn 1');
    assert.equal(turn2.usage.prompt_cache_hit_tokens, turn2.usage.prompt_tokens_details.cached_tokens);
  }
});

test('bad requests: 400 in each API shape, 404 model, 413 body', async () => {
  const post = (path, body, headers = {}) => fetch(main.url + path, {
    method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  let r = await post('/v1/chat/completions', '{"model": ');
  assert.equal(r.status, 400);
  let j = await r.json();
  assert.equal(j.error.type, 'invalid_request_error');
  assert.ok(j.error.message.includes('JSON'));
  r = await post('/v1/messages', '{"model": "claude-x", "messages": [{"role": "user", "content": "x"}]}');
  assert.equal(r.status, 400);
  j = await r.json();
  assert.equal(j.type, 'error');
  assert.equal(j.error.type, 'invalid_request_error');
  assert.ok(j.error.message.includes('max_tokens'));
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: [{ role: 'wizard', content: 'x' }] }),
                       (e) => e.status === 400 && e.message.includes('wizard'));
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: [] }), (e) => e.status === 400);
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: user('x'), max_tokens: 100000 }),
                       (e) => e.status === 400 && e.code === 'context_length_exceeded');
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: user('word '.repeat(3000)) }),
                       (e) => e.status === 400 && e.code === 'context_length_exceeded');
  await assert.rejects(anthropic.messages.create({ model: 'claude-x', max_tokens: 5, messages: [{ role: 'user', content: [
    { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] }),
                       (e) => e.status === 400 && e.message.includes('vision'));
  await assert.rejects(openai.chat.completions.create({ model: 'gpt-4o', messages: user('x') }), (e) => e.status === 404);
  r = await post('/v1/chat/completions', JSON.stringify({ model: MODEL, messages: user('x'.repeat(2 << 20)) }));
  assert.equal(r.status, 413);
  r = await post('/v1/messages', JSON.stringify({ model: 'claude-x', max_tokens: 1, messages: user('x'.repeat(2 << 20)) }));
  assert.equal(r.status, 413);
  assert.equal((await r.json()).error.type, 'request_too_large');
});

test('16 concurrent streams all finish', async () => {
  const runs = Array.from({ length: 16 }, async (_, i) => {
    const stream = await openai.chat.completions.create({ model: MODEL, messages: user(`stream ${i}`), max_tokens: 12,
                                                          stream: true, stream_options: { include_usage: true } });
    let usage = null, finish = null;
    for await (const c of stream) {
      if (c.usage) usage = c.usage;
      if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
    }
    return { usage, finish };
  });
  for (const { usage, finish } of await Promise.all(runs)) {
    assert.equal(finish, 'length');
    assert.equal(usage.completion_tokens, 12);
  }
});

test('a client abort cancels its request', async () => {
  const before = await metric(main.url, 'dsflash_generation_tokens_total');
  const controller = new AbortController();
  const stream = await openai.chat.completions.create({ model: MODEL, messages: user('go on forever'), max_tokens: 1800,
                                                        stream: true }, { signal: controller.signal });
  let n = 0;
  try {
    for await (const _ of stream) { if (++n === 3) controller.abort(); }
  } catch { /* the SDK may report the abort as an error */ }
  let running = 1;
  for (let i = 0; i < 100 && running !== 0; i++) {
    await new Promise((r) => setTimeout(r, 50));
    running = await metric(main.url, 'dsflash_requests_running');
  }
  assert.equal(running, 0, 'the aborted request no longer runs');
  const generated = (await metric(main.url, 'dsflash_generation_tokens_total')) - before;
  assert.ok(generated < 1800, `cancelled after ${generated} of 1800 tokens`);
});

test('/metrics', async () => {
  const text = await (await fetch(main.url + '/metrics')).text();
  for (const name of ['dsflash_requests_running', 'dsflash_requests_waiting', 'dsflash_kv_cache_usage_ratio',
                      'dsflash_prompt_tokens_total', 'dsflash_prompt_tokens_cached_total', 'dsflash_generation_tokens_total',
                      'dsflash_time_to_first_token_seconds_bucket', 'dsflash_inter_token_latency_seconds_count',
                      'dsflash_prefix_cache_hits_total', 'dsflash_prefix_cache_misses_total', 'dsflash_prefix_cache_bytes']) {
    assert.ok(text.includes(name), name);
  }
  assert.ok((await metric(main.url, 'dsflash_generation_tokens_total')) > 0);
  assert.ok((await metric(main.url, 'dsflash_time_to_first_token_seconds_count')) > 0);
});

test('auth: --api-key with Bearer and x-api-key', async () => {
  const server = await startServer(['--api-key', 'sekret']);
  try {
    const bad = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e.status === 401);
    const none = await fetch(server.url + '/v1/messages', { method: 'POST', body: '{}' });
    assert.equal(none.status, 401);
    assert.equal((await none.json()).error.type, 'authentication_error');
    assert.equal((await fetch(server.url + '/health')).status, 200);
    const good = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'sekret', maxRetries: 0 });
    const r = await good.chat.completions.create({ model: MODEL, messages: user('x'), max_tokens: 2 });
    assert.equal(r.usage.completion_tokens, 2);
    const a = new Anthropic({ baseURL: server.url, apiKey: 'sekret', maxRetries: 0 });
    const m = await a.messages.create({ model: 'claude-x', max_tokens: 2, messages: user('x') });
    assert.equal(m.usage.output_tokens, 2);
  } finally {
    assert.equal(await stop(server), 0);
  }
});

test('queue full: 503 (OpenAI) / 529 (Anthropic) with Retry-After; SIGTERM with streams in flight exits 0',
     async () => {
  const server = await startServer(['--max-queue', '2', '--max-batch', '1', '--shutdown-grace', '0.2']);
  const holders = [0, 1].map(() => fetch(server.url + '/v1/chat/completions', {
    method: 'POST', body: JSON.stringify({ model: MODEL, messages: user('hold'), max_tokens: 100000, stream: true }) }));
  const held = await Promise.all(holders);
  const reader = held.map((r) => r.body.getReader());
  await Promise.all(reader.map((r) => r.read()));
  const o = await fetch(server.url + '/v1/chat/completions', {
    method: 'POST', body: JSON.stringify({ model: MODEL, messages: user('x'), max_tokens: 2 }) });
  assert.equal(o.status, 503);
  assert.equal(o.headers.get('retry-after'), '1');
  const a = await fetch(server.url + '/v1/messages', {
    method: 'POST', body: JSON.stringify({ model: 'claude-x', max_tokens: 2, messages: user('x') }) });
  assert.equal(a.status, 529);
  assert.equal((await a.json()).error.type, 'overloaded_error');
  const drained = reader.map(async (r) => { while (!(await r.read()).done); });
  assert.equal(await stop(server), 0);
  await Promise.all(drained);
});

test('--speculative: greedy output unchanged, concurrent streams with drafts finish', async () => {
  const spec = await startServer(['--ctx-size', '2048', '--speculative', '3']);
  try {
    const client = new OpenAI({ baseURL: spec.url + '/v1', apiKey: 'unused', maxRetries: 0 });
    const ask = (c, prompt) => c.completions.create({ model: MODEL, prompt, max_tokens: 24, temperature: 0 });
    for (const prompt of ['The quick brown fox', 'One two three four five six']) {
      const [plain, drafted] = await Promise.all([ask(openai, prompt), ask(client, prompt)]);
      assert.equal(drafted.choices[0].text, plain.choices[0].text);
      assert.equal(drafted.usage.completion_tokens, plain.usage.completion_tokens);
    }
    const streams = await Promise.all([...Array(4).keys()].map(async (i) => {
      const s = await client.chat.completions.create({ model: MODEL, messages: user('stream ' + i), max_tokens: 16,
                                                       temperature: i % 2 ? 0.8 : 0, seed: i, stream: true });
      let finish = null;
      for await (const chunk of s) finish = chunk.choices[0]?.finish_reason ?? finish;
      return finish;
    }));
    assert.deepEqual(streams, ['length', 'length', 'length', 'length']);
  } finally {
    assert.equal(await stop(spec), 0);
  }
});
