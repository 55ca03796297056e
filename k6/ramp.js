// Rate ramp to find the knee: a staircase of request rates (ramping-arrival-rate, open
// model) against one or more targets, one after another. Every request is tagged with
// its path and step, so the summary has p95 per (path, rate step). Run with plain k6:
//
//   k6 run -e TARGETS='{"direct":"http://127.0.0.1:8000"}' -e RATES=10,20,40,80 -e STEP=5s ramp.js
//
// Environment (all optional except TARGETS):
//   TARGETS        JSON object {path name: base URL}; each path gets its own staircase
//   RATES          comma list of requests/s, one plateau each (default 5,10,20,40,80)
//   STEP           length of one plateau, e.g. 5s
//   WARMUP         time at the first rate before measuring (default 2s; its requests are
//                  tagged step=warmup and left out of every step)
//   ENDPOINT       /v1/messages (default) or /v1/chat/completions
//   PAYLOAD        request body JSON file, relative to this script (zgtool bench --ramp writes a copy
//                  with the detected model for bare URLs)
//   STREAM         1: ask for SSE (k6 reads it whole; waiting = time to headers)
//   PRE_VUS, MAX_VUS, SUMMARY (JSON output path)
//   HEADERS        JSON object of extra headers for every path (e.g. an API key)
//   HEADERS_BY_PATH  JSON {path: {header: value}} for per-path keys
//   ARRIVALS       constant (default) or poisson: ticks at RATE x TICKS_PER_REQUEST (default
//                  20), each sending with probability 1/TICKS_PER_REQUEST (Bernoulli thinning;
//                  k6's arrival-rate executors space starts evenly; see gateway_vs_direct.js)
// The rate jumps at each step boundary (a 0s stage), so every request belongs to one
// plateau; requests are tagged by the plateau they started in.

import http from 'k6/http';
import exec from 'k6/execution';
import { check } from 'k6';

const TARGETS = JSON.parse(__ENV.TARGETS || '{"direct":"http://127.0.0.1:8000"}');
const RATES = (__ENV.RATES || '5,10,20,40,80').split(',').map((r) => parseInt(r, 10));
const STEP = __ENV.STEP || '5s';
const ENDPOINT = __ENV.ENDPOINT || '/v1/messages';
const BODY = JSON.parse(open(__ENV.PAYLOAD || './payloads/messages.json'));
BODY.stream = (__ENV.STREAM || '0') === '1';
const PAYLOAD = JSON.stringify(BODY);
const PRE_VUS = parseInt(__ENV.PRE_VUS || '10', 10);
const MAX_VUS = parseInt(__ENV.MAX_VUS || '200', 10);
const IS_OPENAI = ENDPOINT.indexOf('chat/completions') >= 0;
const HEADERS = Object.assign(
  IS_OPENAI ? { 'content-type': 'application/json' }
    : { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
  JSON.parse(__ENV.HEADERS || '{}'));
const HEADERS_BY_PATH = JSON.parse(__ENV.HEADERS_BY_PATH || '{}');
const POISSON = (__ENV.ARRIVALS || 'constant') === 'poisson';
const TICKS = POISSON ? parseInt(__ENV.TICKS_PER_REQUEST || '20', 10) : 1;

function seconds(d) {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m)$/.exec(d);
  if (!m) throw new Error(`STEP and WARMUP must look like 500ms, 5s or 1m, not ${d}`);
  return parseFloat(m[1]) * { ms: 0.001, s: 1, m: 60 }[m[2]];
}

const STEP_S = seconds(STEP);
const WARMUP = __ENV.WARMUP || '2s';
const WARMUP_S = seconds(WARMUP);
const RUN_S = WARMUP_S + STEP_S * RATES.length;

function stages() {
  const out = [{ target: RATES[0] * TICKS, duration: WARMUP }];
  for (const rate of RATES) {
    out.push({ target: rate * TICKS, duration: '0s' }); // jump to the plateau
    out.push({ target: rate * TICKS, duration: STEP });
  }
  return out;
}

const scenarios = {};
const thresholds = {};
Object.keys(TARGETS).forEach((path, i) => {
  scenarios[path] = {
    executor: 'ramping-arrival-rate',
    exec: 'hit',
    startRate: RATES[0] * TICKS,
    timeUnit: '1s',
    stages: stages(),
    preAllocatedVUs: PRE_VUS,
    maxVUs: MAX_VUS,
    startTime: `${i * (RUN_S + 1)}s`,
    tags: { path },
    env: { TARGET: path },
  };
  RATES.forEach((_, step) => {
    // always-true thresholds make k6 keep these sub-metrics in the summary
    thresholds[`http_req_duration{path:${path},step:${step}}`] = ['max>=0'];
    thresholds[`http_reqs{path:${path},step:${step}}`] = ['count>=0'];
    thresholds[`http_req_failed{path:${path},step:${step}}`] = ['rate>=0'];
  });
  thresholds[`dropped_iterations{scenario:${path}}`] = ['count>=0'];
});

export const options = {
  scenarios,
  thresholds,
  summaryTrendStats: ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)', 'p(99)', 'count'],
};

let failureSaid = false;    // per VU

export function hit() {
  if (TICKS > 1 && Math.random() * TICKS >= 1) return; // Poisson thinning
  const elapsedS = (Date.now() - exec.scenario.startTime) / 1000 - WARMUP_S;
  const step = elapsedS < 0 ? 'warmup' : String(Math.min(RATES.length - 1, Math.floor(elapsedS / STEP_S)));
  const res = http.post(TARGETS[__ENV.TARGET].replace(/\/$/, '') + ENDPOINT, PAYLOAD,
    { headers: Object.assign({}, HEADERS, HEADERS_BY_PATH[__ENV.TARGET] || {}), tags: { step }, timeout: __ENV.REQUEST_TIMEOUT || '60s' });
  const ok = check(res, { 'status is 200': (r) => r.status === 200 }, { step });
  if (!ok && !failureSaid) {
    // each VU says its first failure once (k6.log): zgtool names one per path beside its count
    failureSaid = true;
    const what = res.status ? `HTTP ${res.status}` : `${res.error_code || 'no answer'} ${res.error || ''}`.trim();
    console.log(`zgtool-failure ${__ENV.TARGET} POST ${TARGETS[__ENV.TARGET].replace(/\/$/, '')}${ENDPOINT} -> ` +
      `${what}: ${String(res.body || '').replace(/\s+/g, ' ').slice(0, 160)}`);
  }
}

export function handleSummary(data) {
  const lines = ['zgtool k6 ramp: p95 ms of http_req_duration per path and rate'];
  for (const path of Object.keys(TARGETS)) {
    const cells = RATES.map((rate, step) => {
      const m = data.metrics[`http_req_duration{path:${path},step:${step}}`];
      return `${rate}/s:${m && m.values.count ? m.values['p(95)'].toFixed(2) : '-'}`;
    });
    lines.push(`  ${path.padEnd(10)} ${cells.join('  ')}`);
  }
  return {
    [__ENV.SUMMARY || 'ramp-summary.json']: JSON.stringify(data, null, 1),
    stdout: lines.join('\n') + '\n',
  };
}
