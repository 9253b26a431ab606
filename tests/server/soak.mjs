// Bounded soak (not part of CI; scripts/soak_server.sh runs it): STREAMS concurrent streaming chat requests in a
// loop for SECONDS against a running dsflash serve at URL, with the server's RSS (from /proc/PID) sampled every
// second. Prints requests, errors, unfinished streams, tokens and the RSS trend; exits 1 on any error.
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';

const [url, pid, streams = '64', seconds = '120'] = process.argv.slice(2);
const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'unused', maxRetries: 0 });
const deadline = Date.now() + Number(seconds) * 1000;
const rss = () => Number(readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]) / 1024;
const samples = [];
const sampler = setInterval(() => samples.push(rss()), 1000);
let requests = 0, errors = 0, unfinished = 0, tokens = 0;
async function worker(w) {
  for (let i = 0; Date.now() < deadline; i++) {
    try {
      const s = await client.chat.completions.create({ model: process.env.MODEL ?? 'tiny-test',
        messages: [{ role: 'user', content: `soak ${w} ${i}` }], max_tokens: 16 + (i % 48), stream: true,
        stream_options: { include_usage: true }, temperature: 0.8, seed: i });
      let finish = null;
      for await (const c of s) {
        if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
        if (c.usage) tokens += c.usage.completion_tokens;
      }
      requests++;
      if (!finish) unfinished++;
    } catch (e) {
      errors++;
      if (errors < 5) console.error(String(e));
    }
  }
}
const start = rss();
await Promise.all(Array.from({ length: Number(streams) }, (_, w) => worker(w)));
clearInterval(sampler);
const q = Math.floor(samples.length / 4);
const mean = (a) => a.reduce((x, y) => x + y, 0) / Math.max(1, a.length);
console.log(`streams ${streams} for ${seconds} s: ${requests} requests, ${errors} errors, ${unfinished} unfinished, ` +
            `${tokens} tokens (${(tokens / Number(seconds)).toFixed(0)} tok/s)`);
console.log(`server RSS MiB: start ${start.toFixed(1)}, first-quarter mean ${mean(samples.slice(0, q)).toFixed(1)}, ` +
            `last-quarter mean ${mean(samples.slice(-q)).toFixed(1)}, max ${Math.max(...samples).toFixed(1)}`);
process.exit(errors || unfinished ? 1 : 0);
