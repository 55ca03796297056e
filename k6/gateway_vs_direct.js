// Open-model load test: the same request through the gateway, direct to the engine,
// and direct with streaming. Run with plain k6 or through `zgtool bench`:
//
//   k6 run -e DIRECT_URL=http://127.0.0.1:8000 -e GATEWAY_URL=http://127.0.0.1:8080 \
//          -e RATE=20 -e DURATION=30s gateway_vs_direct.js
//
// Environment (all optional):
//   DIRECT_URL, GATEWAY_URL   base URLs (default 127.0.0.1:8000 / :8080)
//   ENDPOINT                  /v1/messages (Anthropic) or /v1/chat/completions (OpenAI)
//   PAYLOAD                   request body JSON file, relative to this script; a JSON array of
//                             bodies (zgtool bench --dataset): iteration i sends body i mod N
//   RATE                      requests per second per scenario (constant-arrival-rate)
//   ARRIVALS                  constant (default: evenly spaced) or poisson (see below)
//   TICKS_PER_REQUEST         poisson only: arrival-rate ticks per request (default 20)
//   DURATION                  per scenario, e.g. 30s
//   PRE_VUS, MAX_VUS          pre-allocated and maximum VUs per scenario
//   SCENARIOS                 comma list out of gateway,direct,direct_stream
//   SEQUENTIAL                1 (default): scenarios run one after another so they do not
//                             compete for the same CPUs; 0: all at once
//   ROUNDS                    with SEQUENTIAL: the scenarios take turns in this many rounds, each
//                             a slice of DURATION (default 1: each scenario once, whole)
//   DIRECT_HEADERS, GATEWAY_HEADERS   JSON objects of extra request headers (API keys); one named like a
//                             default header (any case) replaces it
//   ACCEPT_ENCODING           what the requests accept (default "gzip, deflate", what the OpenAI and
//                             Anthropic SDKs send through httpx: a compressing gateway compresses for
//                             them, and k6 decodes the answer); "identity" as curl sends
//   SUMMARY                   where handleSummary writes the JSON summary
//
// Open model: a request starts every 1/RATE s whether or not earlier ones finished,
// so a slow server cannot slow the load down (no coordinated omission).
// Poisson arrivals (what vLLM's benchmark_serving sends by default): k6's arrival-rate
// executors space iteration starts evenly, so ARRIVALS=poisson runs the executor at
// RATE x TICKS_PER_REQUEST ticks/s and lets each tick send a request with probability
// 1/TICKS_PER_REQUEST (Bernoulli thinning): request counts per interval are binomial,
// converging to Poisson, and gaps are geometric on a 1/(RATE x TICKS) s grid, i.e.
// exponential to within that grid. A tick that sends nothing returns in microseconds, so
// it holds no VU; dropped_iterations then counts ticks, of which 1/TICKS would have sent. Iterations that
// find no free VU are counted in dropped_iterations: the load generator could not keep
// the rate. k6 reads a streaming (SSE) body only as a whole, so for direct_stream
// http_req_waiting is the time to the response headers, not time to first token.

import http from 'k6/http';
import { check } from 'k6';
import { SharedArray } from 'k6/data';
import exec from 'k6/execution';
import { Counter } from 'k6/metrics';

const DIRECT_URL = (__ENV.DIRECT_URL || 'http://127.0.0.1:8000').replace(/\/$/, '');
const GATEWAY_URL = (__ENV.GATEWAY_URL || 'http://127.0.0.1:8080').replace(/\/$/, '');
const ENDPOINT = __ENV.ENDPOINT || '/v1/messages';
const PAYLOAD_FILE = __ENV.PAYLOAD || './payloads/messages.json';
const RATE = parseInt(__ENV.RATE || '10', 10);
const POISSON = (__ENV.ARRIVALS || 'constant') === 'poisson';
const TICKS = POISSON ? parseInt(__ENV.TICKS_PER_REQUEST || '20', 10) : 1;
const DURATION = __ENV.DURATION || '30s';
const REQUEST_TIMEOUT = __ENV.REQUEST_TIMEOUT || '60s';   // k6's per-request timeout (zgtool bench --timeout-s)
const PRE_VUS = parseInt(__ENV.PRE_VUS || '10', 10);
const MAX_VUS = parseInt(__ENV.MAX_VUS || '50', 10);
const SEQUENTIAL = (__ENV.SEQUENTIAL || '1') !== '0';
const ROUNDS = Math.max(1, parseInt(__ENV.ROUNDS || '1', 10));
const SELECTED = (__ENV.SCENARIOS || 'gateway,direct,direct_stream').split(',').map((s) => s.trim()).filter(Boolean);
const PHASES = ['http_req_blocked', 'http_req_connecting', 'http_req_tls_handshaking', 'http_req_sending',
  'http_req_waiting', 'http_req_receiving', 'http_req_duration'];

// Requests that went out on a new TCP connection although their VU had already sent one to the
// same target: the server (or a hop) closed the kept-alive connection after its answer (llama-server
// does after every streamed answer), so their durations include a connect. A VU's first request
// always connects and is not counted.
const RECONNECTS = new Counter('zg_reconnects');
const sentBefore = {};   // per VU: targets it has sent to

// One body, or an array of them: parsed and encoded (plain, stream) once, shared read-only by every VU.
const BODIES = new SharedArray('bodies', () => {
  const doc = JSON.parse(open(PAYLOAD_FILE));
  return (Array.isArray(doc) ? doc : [doc]).map((b) => [JSON.stringify(Object.assign({}, b, { stream: false })),
    JSON.stringify(Object.assign({}, b, { stream: true }))]);
});
const PLAIN_BODY = BODIES[0][0];
const STREAM_BODY = BODIES[0][1];
const IS_OPENAI = ENDPOINT.indexOf('chat/completions') >= 0;
const ACCEPT_ENCODING = __ENV.ACCEPT_ENCODING || 'gzip, deflate';
const BASE_HEADERS = IS_OPENAI
  ? { 'content-type': 'application/json', 'accept-encoding': ACCEPT_ENCODING }
  : { 'content-type': 'application/json', 'anthropic-version': '2023-06-01', 'accept-encoding': ACCEPT_ENCODING };

function headers(envName) {
  const extra = JSON.parse(__ENV[envName] || '{}');
  const base = Object.assign({}, BASE_HEADERS);
  for (const name of Object.keys(extra)) {
    for (const own of Object.keys(base)) {
      if (own.toLowerCase() === name.toLowerCase()) delete base[own];   // the user's header, not two of one name
    }
  }
  return Object.assign(base, extra);
}

const TARGETS = {
  gateway: { url: GATEWAY_URL + ENDPOINT, body: PLAIN_BODY, headers: headers('GATEWAY_HEADERS'), stream: false },
  direct: { url: DIRECT_URL + ENDPOINT, body: PLAIN_BODY, headers: headers('DIRECT_HEADERS'), stream: false },
  direct_stream: { url: DIRECT_URL + ENDPOINT, body: STREAM_BODY, headers: headers('DIRECT_HEADERS'), stream: true },
};

function seconds(d) {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)$/.exec(d);
  if (!m) throw new Error(`DURATION must look like 500ms, 30s, 2m or 1h, not ${d}`);
  return parseFloat(m[1]) * { ms: 0.001, s: 1, m: 60, h: 3600 }[m[2]];
}

// Sequential scenarios take turns in ROUNDS rounds (direct, gateway, direct_stream, direct, gateway, ...), each
// round a 1/ROUNDS slice of DURATION: a drift of the machine (or the first scenario's warm-up) then falls on every
// path alike instead of on whichever ran first, and each request's round (its `round` tag) lets zgtool pair the
// paths round by round as latency-split does. ROUNDS=1 is the old one-after-another order.
function buildScenarios() {
  const out = {};
  const rounds = SEQUENTIAL ? ROUNDS : 1;
  const sliceS = seconds(DURATION) / rounds;
  const gapS = rounds > 1 ? 0.25 : 1; // a pause between turns lets the previous one's connections drain
  let slot = 0;
  for (let r = 0; r < rounds; r++) {
    SELECTED.forEach((name) => {
      if (!TARGETS[name]) throw new Error(`unknown scenario ${name}; choose from ${Object.keys(TARGETS)}`);
      out[rounds > 1 ? `${name}_r${r}` : name] = {
        executor: 'constant-arrival-rate',
        exec: 'hit',
        rate: RATE * TICKS,
        timeUnit: '1s',
        duration: rounds > 1 ? `${Math.round(sliceS * 1000)}ms` : DURATION,
        preAllocatedVUs: PRE_VUS,
        maxVUs: MAX_VUS,
        startTime: SEQUENTIAL ? `${Math.round(slot * (sliceS + gapS) * 1000)}ms` : '0s',
        tags: { path: name, round: String(r) },
        env: { TARGET: name },
      };
      slot += 1;
    });
  }
  return out;
}

// Thresholds that always hold make k6 keep a per-path sub-metric of every phase in the
// summary; without them the summary only has totals over all paths.
function buildThresholds() {
  const t = {};
  for (const name of SELECTED) {
    for (const phase of PHASES) t[`${phase}{path:${name}}`] = ['max>=0'];
    t[`http_reqs{path:${name}}`] = ['count>=0'];
    t[`http_req_failed{path:${name}}`] = ['rate>=0'];
    t[`checks{path:${name}}`] = ['rate>=0'];
    t[`iterations{path:${name}}`] = ['count>=0'];
    t[`zg_reconnects{path:${name}}`] = ['count>=0'];
  }
  for (const scenario of Object.keys(SCENARIO_SET)) t[`dropped_iterations{scenario:${scenario}}`] = ['count>=0'];
  return t;
}

const SCENARIO_SET = buildScenarios();

export const options = {
  scenarios: SCENARIO_SET,
  thresholds: buildThresholds(),
  summaryTrendStats: ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)', 'p(99)', 'count'],
  discardResponseBodies: false,
};

let failureSaid = false;    // per VU

// k6 (v1.1) sometimes starts one iteration more than rate x duration: one at the slice's very end (rate 2 over
// 1 s started 3, 20 over 1 s 21, 2 over 3 s 7, 2 over 10 s 20). In 10 one-second rounds at 2 req/s that sent 30
// requests for 20 asked, each extra one overlapping the next turn. Each scenario (a path's turn) starts this many
// iterations and no more; a start past them sends nothing (iterationInTest counts across k6 instances, so
// segments keep the same cap).
const STARTS_PER_SCENARIO = Math.round(RATE * TICKS * (seconds(DURATION) / (SEQUENTIAL ? ROUNDS : 1)));

export function hit() {
  if (exec.scenario.iterationInTest >= STARTS_PER_SCENARIO) return;
  if (TICKS > 1 && Math.random() * TICKS >= 1) return; // Poisson thinning: most ticks send nothing
  const target = TARGETS[__ENV.TARGET];
  const body = BODIES.length > 1
    ? BODIES[exec.scenario.iterationInTest % BODIES.length][target.stream ? 1 : 0] : target.body;
  const res = http.post(target.url, body, { headers: target.headers, timeout: REQUEST_TIMEOUT });
  if (sentBefore[__ENV.TARGET] && res.timings.connecting > 0) RECONNECTS.add(1);
  sentBefore[__ENV.TARGET] = true;
  const done = IS_OPENAI ? '[DONE]' : 'message_stop';
  const ok = check(res, {
    'status is 200': (r) => r.status === 200,
    'complete body': (r) => (target.stream ? String(r.body).indexOf(done) >= 0 : String(r.body).length > 0),
  });
  if (!ok && !failureSaid) {
    // each VU says its first failure once (k6.log): zgtool names one per scenario beside its count
    failureSaid = true;
    const what = res.status ? `HTTP ${res.status}` : `${res.error_code || 'no answer'} ${res.error || ''}`.trim();
    console.log(`zgtool-failure ${__ENV.TARGET} POST ${target.url} -> ${what}: ` +
      String(res.body || '').replace(/\s+/g, ' ').slice(0, 160));
  }
}

export function handleSummary(data) {
  const lines = ['zgtool k6 gateway_vs_direct: p95 ms of http_req_duration per path'];
  for (const name of SELECTED) {
    const d = data.metrics[`http_req_duration{path:${name}}`];
    const n = data.metrics[`http_reqs{path:${name}}`];
    const f = data.metrics[`http_req_failed{path:${name}}`];
    lines.push(`  ${name.padEnd(14)} p95=${d ? d.values['p(95)'].toFixed(2) : '-'} ms  ` +
      `requests=${n ? n.values.count : 0}  failed=${f ? f.values.passes : 0}`);
  }
  return {
    [__ENV.SUMMARY || 'summary.json']: JSON.stringify(data, null, 1),
    stdout: lines.join('\n') + '\n',
  };
}
