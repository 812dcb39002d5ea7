// The official OpenAI SDK for Node.js through dplb to the mock engine: chat and completions, streaming and not,
// get every token and the usage; the same requests sent straight to the engine get the same text; the models
// list works; an engine's error reaches the SDK as its typed error with the status and OpenAI's message; a
// stream the client aborts leaves nothing in flight in dplb. maxRetries 0: a retry must not hide an error.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startDplb, startMockEngine } from './support.mjs';

const MODEL = 'mock-model';
let mock, dplb, viaDplb, direct;

before(async () => {
  // 2 ranks; a token every 20 ms so that an abort lands mid-stream.
  mock = await startMockEngine('sdk-mock', 2, ['--itl-ms', '20']);
  dplb = await startDplb('sdk-dplb', mock.ports, ['--policy', 'round-robin']);
  viaDplb = new OpenAI({ baseURL: `${dplb.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 20000 });
  direct = new OpenAI({ baseURL: `http://127.0.0.1:${mock.ports[0]}/v1`, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  await dplb?.child.stop();
  await mock?.child.stop();
});

async function collect(stream) {
  let text = '';
  let chunks = 0;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      const piece = choice.delta?.content ?? choice.text ?? '';
      if (piece) chunks += 1;
      text += piece;
    }
  }
  return { text, chunks, usage };
}

async function inflight() {
  const metrics = await (await fetch(`${dplb.url}/metrics`)).text();
  return [...metrics.matchAll(/^dplb_rank_inflight\{[^}]*\} (\S+)$/gm)].reduce((sum, m) => sum + Number(m[1]), 0);
}

test('models.list through dplb names the served model', async () => {
  const models = [];
  for await (const model of viaDplb.models.list()) models.push(model.id);
  assert.deepEqual(models, [MODEL]);
});

test('chat.completions.create, not streaming: the whole answer and its usage, as the engine gives them', async () => {
  const request = { model: MODEL, messages: [{ role: 'user', content: 'Say hello' }], max_tokens: 7 };
  const got = await viaDplb.chat.completions.create(request);
  const want = await direct.chat.completions.create(request);
  assert.equal(got.object, 'chat.completion');
  assert.equal(got.choices[0].message.content, want.choices[0].message.content);
  assert.equal(got.usage.completion_tokens, 7);
  assert.deepEqual(got.usage, want.usage);
});

test('completions.create, not streaming: the whole text and its usage', async () => {
  const request = { model: MODEL, prompt: 'Once upon a time', max_tokens: 5 };
  const got = await viaDplb.completions.create(request);
  const want = await direct.completions.create(request);
  assert.equal(got.choices[0].text, want.choices[0].text);
  assert.equal(got.usage.completion_tokens, 5);
  assert.deepEqual(got.usage, want.usage);
});

test('chat streaming with include_usage: every token chunk and the usage chunk', async () => {
  const request = {
    model: MODEL, messages: [{ role: 'user', content: 'Count' }], max_tokens: 6, stream: true,
    stream_options: { include_usage: true },
  };
  const got = await collect(await viaDplb.chat.completions.create(request));
  const want = await collect(await direct.chat.completions.create(request));
  assert.equal(got.chunks, 6);
  assert.equal(got.text, want.text);
  assert.deepEqual(got.usage, want.usage);
  assert.equal(got.usage.completion_tokens, 6);
});

test('completions streaming with include_usage: every token chunk and the usage chunk', async () => {
  const request = { model: MODEL, prompt: 'A B C', max_tokens: 4, stream: true, stream_options: { include_usage: true } };
  const got = await collect(await viaDplb.completions.create(request));
  const want = await collect(await direct.completions.create(request));
  assert.equal(got.chunks, 4);
  assert.equal(got.text, want.text);
  assert.deepEqual(got.usage, want.usage);
});

test("an engine's error reaches the SDK as its typed error, with the status and OpenAI's message", async () => {
  await assert.rejects(
    viaDplb.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
    (error) => {
      assert.ok(error instanceof OpenAI.NotFoundError, `got ${error?.constructor?.name}: ${error}`);
      assert.equal(error.status, 404);
      assert.match(error.message, /no-such-model/);
      return true;
    });
});

test("dplb's own error (a body over --max-request-body-bytes) is an OpenAI-shaped error the SDK reads", async () => {
  const small = await startDplb('sdk-dplb-small', mock.ports, ['--max-request-body-bytes', '1024']);
  try {
    const client = new OpenAI({ baseURL: `${small.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    await assert.rejects(
      client.completions.create({ model: MODEL, prompt: 'x'.repeat(4096), max_tokens: 1 }),
      (error) => {
        assert.ok(error instanceof OpenAI.APIError, `got ${error?.constructor?.name}: ${error}`);
        assert.equal(error.status, 413);
        assert.ok(error.error?.message, `an OpenAI error object: ${JSON.stringify(error.error)}`);
        return true;
      });
  } finally {
    await small.child.stop();
  }
});

test('a stream the client aborts mid-way leaves nothing in flight in dplb', async () => {
  const controller = new AbortController();
  const stream = await viaDplb.chat.completions.create(
    { model: MODEL, messages: [{ role: 'user', content: 'long' }], max_tokens: 500, stream: true },
    { signal: controller.signal });
  let chunks = 0;
  try {
    for await (const chunk of stream) {
      if (chunk.choices[0]?.delta?.content) chunks += 1;
      if (chunks === 3) {
        assert.equal(await inflight(), 1, 'the stream is in flight while it runs');
        controller.abort();
      }
    }
  } catch (error) {
    // The SDK ends the iteration on an abort, or throws its abort error: both are an abort.
    if (!(error instanceof OpenAI.APIUserAbortError || error.name === 'AbortError')) throw error;
  }
  assert.equal(chunks, 3, 'no chunk after the abort');
  const deadline = Date.now() + 5000;
  while ((await inflight()) !== 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  assert.equal(await inflight(), 0);
});
