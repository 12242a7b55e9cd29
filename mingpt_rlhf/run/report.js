// The run report's script (report.py inlines this file into each page). It reads the runs
// embedded as JSON in #data and builds the page: 1. each run's final comparison and options,
// 2. the curves of metrics.jsonl as SVG, 3. the token view of rollouts.jsonl. Everything a
// run wrote (tokens, prompts, options) enters the page as text nodes, never as HTML.
"use strict";

const errors = document.getElementById("errors");
function reportError(message) {  // shown on the page, where a reader (or a test) sees it
  errors.appendChild(document.createTextNode("error in this page: " + message + " "));
}
window.addEventListener("error", (e) => reportError(e.message));

const DATA = JSON.parse(document.getElementById("data").textContent);
const RUN_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b"];
const SVG = "http://www.w3.org/2000/svg";

// ---------------------------------------------------------------------------- helpers
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
  }
  return node;
}

function svgEl(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function fmt(x, digits = 4) {  // a number as the tooltips print it
  if (x === null || x === undefined) return "-";
  if (Number.isInteger(x)) return String(x);
  const a = Math.abs(x);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? x.toExponential(2) : String(+x.toPrecision(digits));
}

function signed(x) { return x === null || x === undefined ? "-" : (x > 0 ? "+" : "") + fmt(x); }

const tip = el("div", {id: "tip"});
document.body.appendChild(tip);
function showTip(event, text) {
  tip.textContent = text;
  tip.style.display = "block";
  const x = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
  const y = Math.min(event.clientY + 14, window.innerHeight - tip.offsetHeight - 8);
  tip.style.left = Math.max(0, x) + "px";
  tip.style.top = Math.max(0, y) + "px";
}
function hideTip() { tip.style.display = "none"; }

function percentile(values, q) {  // the q-quantile of a list of numbers (0 for none)
  if (!values.length) return 0;
  const sorted = values.slice().sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

// ---------------------------------------------------------------------------- 1. the runs
function runSummaries() {
  const box = el("div", {class: "runs"});
  DATA.runs.forEach((run, i) => {
    const part = el("div", {class: "run", id: "run-" + i},
      el("h3", {}, el("span", {class: "swatch", style: "background:" + RUN_COLORS[i % RUN_COLORS.length]}),
         run.name), el("div", {class: "note"}, run.folder));
    for (const line of run.missing) part.appendChild(el("div", {class: "missing"}, line));
    if (run.comparison.length) part.appendChild(el("pre", {class: "comparison"}, run.comparison.join("\n")));
    if (run.options) {
      const table = el("table", {class: "options"});
      for (const [k, v] of Object.entries(run.options)) {
        table.appendChild(el("tr", {}, el("td", {}, "--" + k), el("td", {}, JSON.stringify(v))));
      }
      part.appendChild(el("details", {}, el("summary", {}, "options of this run"), table));
    }
    box.appendChild(part);
  });
  return box;
}

// ---------------------------------------------------------------------------- 2. curves
// each panel: a title and its series, [metric, "train" | "eval"]
const PANELS = [
  {title: "reward and gold", series: [["rm_score", "train"], ["reward", "train"], ["gold", "eval"],
                                      ["rm_score", "eval"], ["reward", "eval"], ["success", "eval"]]},
  {title: "KL to the reference (nats per response)", series: [["kl", "train"], ["kl", "eval"]]},
  {title: "KL coefficient beta", series: [["kl_coef", "train"]]},
  {title: "entropy (nats per token)", series: [["entropy", "train"]]},
  {title: "clipfrac and approx-KL", series: [["clipfrac", "train"], ["approx_kl", "train"]]},
  {title: "response length (tokens)", series: [["resp_len", "train"]]},
  {title: "seconds of each phase", series: [["t_generate", "train"], ["t_score", "train"], ["t_learn", "train"]]},
  {title: "explained variance of the critic", series: [["explained_var", "train"]]},
  {title: "groups with no signal (grpo, rloo)", series: [["zero_groups", "train"], ["dropped_groups", "train"]]},
  {title: "sampler vs learner KL", series: [["mismatch_kl", "train"]]},
  {title: "turns (episodes)", series: [["turns", "train"], ["turns", "eval"]]},
];
const DASHES = ["", "2 3", "7 3", "1 2", "9 2 2 2", "4 4"];  // one per series of a panel

function seriesOf(run, key, split) {  // [[step, value], ...] of one metric of one run
  return run.rows
    .filter((r) => (split === "eval" ? r.split === "eval" : !("split" in r) && !r.final))
    .filter((r) => typeof r[key] === "number")
    .map((r) => [r.step, r[key]]);
}

function niceTicks(lo, hi, count) {  // about `count` round numbers in [lo, hi], and their labels
  const span = hi - lo || Math.abs(hi) || 1;
  const raw = span / count, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  while (Math.floor(hi / step) - Math.ceil(lo / step) + 1 < 3) step /= 2;  // at least 3
  let decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  const scaled = step * Math.pow(10, decimals);
  if (Math.abs(scaled - Math.round(scaled)) > 1e-6) decimals += 1;  // a step of 2.5, 0.25, ...
  const big = Math.max(Math.abs(lo), Math.abs(hi));
  const ticks = [];
  for (let i = Math.ceil(lo / step); i * step <= hi + step * 1e-9; i++) {
    const t = i * step;
    ticks.push([t, big >= 1e5 || decimals > 4 ? t.toExponential(1) : t.toFixed(decimals)]);
  }
  return ticks;
}

function drawPanel(panel) {
  const lines = [];  // {run, key, split, points, color, dash}
  DATA.runs.forEach((run, r) => panel.series.forEach(([key, split], s) => {
    const points = seriesOf(run, key, split);
    if (points.length) lines.push({run: run.name, key, split, points, color: RUN_COLORS[r % RUN_COLORS.length], dash: DASHES[s % DASHES.length]});
  }));
  if (!lines.length) return null;
  const W = 270, H = 160, L = 40, R = 8, T = 8, B = 20;
  const all = lines.flatMap((l) => l.points);
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const pad = (y1 - y0) * 0.06;
  y0 -= pad; y1 += pad;
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const svg = svgEl("svg", {viewBox: `0 0 ${W} ${H}`, role: "img"});
  for (const [t, text] of niceTicks(y0, y1, 4)) {
    svg.appendChild(svgEl("line", {class: "grid", x1: L, x2: W - R, y1: sy(t), y2: sy(t)}));
    const label = svgEl("text", {x: L - 4, y: sy(t) + 3, "text-anchor": "end"});
    label.textContent = text;
    svg.appendChild(label);
  }
  for (const [t, text] of niceTicks(x0, x1, 5)) {
    const label = svgEl("text", {x: sx(t), y: H - 6, "text-anchor": "middle"});
    label.textContent = text;
    svg.appendChild(label);
  }
  svg.appendChild(svgEl("line", {class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B}));
  svg.appendChild(svgEl("line", {class: "axis", x1: L, x2: L, y1: T, y2: H - B}));
  for (const l of lines) {
    const d = l.points.map((p, i) => (i ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(p[1]).toFixed(1)).join("");
    svg.appendChild(svgEl("path", {d, fill: "none", stroke: l.color, "stroke-width": l.split === "eval" ? 1 : 1.4,
                                   "stroke-dasharray": l.dash, class: "series"}));
    if (l.split === "eval") {
      for (const p of l.points) svg.appendChild(svgEl("circle", {cx: sx(p[0]), cy: sy(p[1]), r: 2.6, fill: l.color}));
    }
  }
  const cursor = svgEl("line", {class: "cursor", y1: T, y2: H - B, visibility: "hidden"});
  svg.appendChild(cursor);
  svg.addEventListener("mousemove", (event) => {
    const at = new DOMPoint(event.clientX, event.clientY).matrixTransform(svg.getScreenCTM().inverse());
    const step = x0 + (at.x - L) / (W - L - R) * (x1 - x0);
    const text = [];
    let shown = null;
    for (const l of lines) {  // each series' point nearest to the mouse's step
      const p = l.points.reduce((a, b) => (Math.abs(b[0] - step) < Math.abs(a[0] - step) ? b : a));
      shown = shown === null ? p[0] : shown;
      text.push(`${l.run} ${l.key}${l.split === "eval" ? " (eval)" : ""}: ${fmt(p[1])} at step ${p[0]}`);
    }
    cursor.setAttribute("x1", sx(shown));
    cursor.setAttribute("x2", sx(shown));
    cursor.setAttribute("visibility", "visible");
    showTip(event, text.join("\n"));
  });
  svg.addEventListener("mouseleave", () => { cursor.setAttribute("visibility", "hidden"); hideTip(); });
  const keys = el("div", {class: "keys"});
  for (const l of lines) {
    const sample = svgEl("svg", {width: 22, height: 8});
    sample.appendChild(svgEl("line", {x1: 0, x2: 22, y1: 4, y2: 4, stroke: l.color, "stroke-width": 2,
                                      "stroke-dasharray": l.dash}));
    if (l.split === "eval") sample.appendChild(svgEl("circle", {cx: 11, cy: 4, r: 2.6, fill: l.color}));
    const name = (DATA.runs.length > 1 ? l.run + " " : "") + l.key + (l.split === "eval" ? " (eval)" : "");
    keys.appendChild(el("span", {}, sample, " " + name));
  }
  return el("div", {class: "panel"}, el("div", {class: "title"}, panel.title), svg, keys);
}

function curves() {
  const box = el("div", {class: "panels", id: "curves"});
  for (const panel of PANELS) {
    const drawn = drawPanel(panel);
    if (drawn) box.appendChild(drawn);
  }
  return box;
}

// ---------------------------------------------------------------------------- 3. tokens
// what a token's colour can show: its value at token i of a recorded response `r`
const QUANTITIES = {
  advantage: {
    label: "advantage", signed: true, get: (r, i) => r.advantage[i],
    meaning: "How much better than expected the response turned out from this token on: the update " +
      "raises the probability of a token with a positive advantage (green: credited) and lowers it " +
      "for a negative one (red: charged). PPO's advantages come from GAE with the critic's values and " +
      "differ token by token; GRPO's and RLOO's are one number per response (its reward against its " +
      "group's), the same on each of its tokens.",
    healthy: "Healthy: both colours on every page (PPO whitens the advantages of a batch, GRPO and " +
      "RLOO centre each group). All white means no signal: a group whose responses all scored the " +
      "same, or a critic that predicts the return exactly."},
  weight: {
    label: "weight in the update", signed: true, get: (r, i) => (r.weight ? r.weight[i] : null),
    meaning: "What multiplies the gradient of this token's log-probability when these responses are " +
      "learnt as one minibatch, at its first step (the ratio to the sampling policy is 1, so nothing is " +
      "clipped yet): the advantage x what the loss's reduction gives the token, per response (PPO's " +
      "token mean: responses / tokens; GRPO's sequence mean: 1 / its length; the budget sum: " +
      "1 / the budget), plus, with the KL in the loss, the KL term's share (-beta x the normaliser x " +
      "the estimator's slope). Green raises the token's probability, red lowers it. The entropy bonus " +
      "is left out: its gradient does not follow this token's log-probability.",
    healthy: "Healthy: like the advantage, both colours on every page. Short responses brighter than " +
      "long ones with the same advantage is the sequence mean's length bias; a KL share as large as " +
      "the advantage's part means the penalty, not the reward, is steering."},
  kl: {
    label: "KL (log-prob - reference log-prob)", signed: true,
    get: (r, i) => (r.logprob[i] === null || r.ref_logprob[i] === null ? null : r.logprob[i] - r.ref_logprob[i]),
    // what the penalty charges depends on the run's --kl_in: report.py's kl_legend says it
    meaning: (run) => "log pi(token) - log pi_ref(token): how much more likely the trained policy " +
      "makes this token than the SFT reference did (green: more likely, red: less). " + run.kl_legend,
    healthy: "Healthy: most tokens pale, a few strong ones where the policy changed its mind, the sum " +
      "near --kl_target. Deep green on every token means the policy has drifted far from the " +
      "reference, where reward hacking starts."},
  value: {
    label: "value (critic)", signed: true, get: (r, i) => (r.value ? r.value[i] : null),
    meaning: "The critic's estimate, before the token was chosen, of the return still to come (the " +
      "score, less the KL penalty ahead). Only PPO has a critic.",
    healthy: "Healthy: it follows the score, green in responses that score well and red in poor ones, " +
      "changing where a response gets better or worse. One colour everywhere whatever the score means " +
      "the critic learnt nothing (its explained variance stays near 0)."},
  entropy: {
    label: "entropy", signed: false, get: (r, i) => r.entropy[i],
    meaning: "How unsure the policy was when it chose this token, in nats (darker: more unsure; " +
      "0 = it could write nothing else).",
    healthy: "Healthy: it falls slowly during training and stays above 0 at the choices that matter. " +
      "White everywhere at the last eval means the policy has become deterministic (a collapse: " +
      "distinct2 falls with it)."},
  reward: {
    label: "reward (shaped)", signed: true, get: (r, i) => r.reward[i],
    meaning: "The reward each token received. PPO and REINFORCE++: -beta x its KL on every token (a " +
      "small charge where the policy is more likely than the reference) and the score added on the " +
      "last token (with an environment, each turn's reward on that turn's last token). GRPO and " +
      "RLOO: one reward per response, shown on each of its tokens.",
    healthy: "Healthy: a faint wash over the response and one strong last token whose colour follows " +
      "the score."},
};
const POSITIVE = [44, 160, 44], NEGATIVE = [214, 39, 40], UNSURE = [117, 80, 180];

function mix(rgb, t) {  // white -> rgb as t goes 0 -> 1
  const c = rgb.map((v) => Math.round(255 + (v - 255) * Math.min(1, Math.abs(t))));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function colour(q, x, scale) {
  if (x === null || x === undefined || !scale) return "transparent";
  if (!q.signed) return mix(UNSURE, x / scale);
  return mix(x >= 0 ? POSITIVE : NEGATIVE, x / scale);
}

function scaleOf(lines, q) {  // |x| of the 98th percentile over every token the run recorded
  const values = [];
  for (const r of lines) r.tokens.forEach((_, i) => { const x = q.get(r, i); if (x !== null && x !== undefined) values.push(Math.abs(x)); });
  return percentile(values, 0.98);
}

function tokenTip(r, i) {
  const head = `token ${JSON.stringify(r.tokens[i])}  (id ${r.ids[i]}, position ${i + 1} of the response)`;
  if (r.env[i]) return head + "\nthe environment's token: read by the policy, not an action\n(no loss, KL, value or advantage)";
  const kl = QUANTITIES.kl.get(r, i);
  return [head,
    `advantage  ${signed(r.advantage[i])}`,
    ...(r.weight ? [`weight     ${signed(r.weight[i])}   (normaliser ${fmt(r.normaliser[i])}, KL share ${signed(r.weight_kl[i])})`] : []),
    `KL         ${signed(kl)}   (log-prob ${fmt(r.logprob[i])}, reference ${fmt(r.ref_logprob[i])})`,
    `value      ${r.value ? signed(r.value[i]) : "- (no critic)"}`,
    `reward     ${signed(r.reward[i])}`,
    `entropy    ${fmt(r.entropy[i])}`].join("\n");
}

function responseTokens(r, q, scale) {
  const box = el("div", {class: "tokens"});
  r.tokens.forEach((text, i) => {
    // a token holding the first bytes of a character shows as a dot: the next one writes it
    const span = el("span", {class: r.env[i] ? "tok env" : text ? "tok" : "tok part"}, text || "\u00b7");
    if (!r.env[i]) span.style.background = colour(q, q.get(r, i), scale);
    span.addEventListener("mousemove", (event) => showTip(event, tokenTip(r, i)));
    span.addEventListener("mouseleave", hideTip);
    box.appendChild(span);
  });
  return box;
}

function extremes(r, q) {  // the tokens with the highest and the lowest value of q
  let hi = null, lo = null;
  r.tokens.forEach((_, i) => {
    const x = q.get(r, i);
    if (x === null || x === undefined || r.env[i]) return;
    if (hi === null || x > hi[1]) hi = [i, x];
    if (lo === null || x < lo[1]) lo = [i, x];
  });
  return [hi, lo];
}

function creditLine(r, q, qname) {  // where the picked quantity is highest and lowest
  const [hi, lo] = extremes(r, q);
  if (!hi || !q.signed) return null;
  // the advantage's sign is what the update does: credited (> 0) or charged (< 0)
  const credit = qname === "advantage";
  if (hi[1] === lo[1]) {  // one number for the whole response (GRPO's, RLOO's advantage)
    const what = !credit ? "every token" : hi[1] > 0 ? "every token credited" :
      hi[1] < 0 ? "every token charged" : "no token credited or charged";
    return el("div", {}, el("b", {}, what + ": "), signed(hi[1]));
  }
  const line = el("div", {});
  const show = (name, [i, x]) => {
    if (line.childNodes.length) line.append("; ");
    line.append(el("b", {}, name + ": "), `${JSON.stringify(r.tokens[i])} (${signed(x)})`);
  };
  if (!credit || hi[1] > 0) show(credit ? "credited most" : "highest", hi);
  if (!credit || lo[1] < 0) show(credit ? "charged most" : "lowest", lo);
  return line;
}

function facts(r, q, qname) {  // a response's figures, and where its tokens stand out
  const figures = [`score ${fmt(r.score)}`];
  if (r.gold !== undefined) figures.push(`gold ${fmt(r.gold)}`);
  for (const [k, v] of Object.entries(r.check || {})) figures.push(`${k} ${fmt(v)}`);
  figures.push(`KL ${fmt(r.kl)}`, `${r.resp_len} tokens`);
  return el("div", {class: "facts"}, figures.join(" · "), creditLine(r, q, qname));
}

function legend(q, scale, run) {
  const bar = el("div", {class: "bar"});
  const stops = q.signed ? [mix(NEGATIVE, 1), "#fff", mix(POSITIVE, 1)] : ["#fff", mix(UNSURE, 1)];
  bar.appendChild(el("div", {class: "gradient", style: `background: linear-gradient(to right, ${stops.join(",")})`}));
  bar.appendChild(el("div", {class: "ends"}, el("span", {}, q.signed ? "-" + fmt(scale, 2) : "0"),
                     el("span", {}, q.signed ? "0" : ""), el("span", {}, fmt(scale, 2) + " or more")));
  const meaning = typeof q.meaning === "function" ? q.meaning(run) : q.meaning;
  const text = el("div", {}, el("p", {}, el("b", {}, q.label + ". "), meaning), el("p", {}, q.healthy),
    el("p", {class: "note"}, "Hover a token for all its numbers. Hatched grey tokens are an environment's " +
       "replies. The colours saturate at the 98th percentile of the run's |values|, the same scale at " +
       "every eval, so the columns compare."));
  return el("div", {class: "legend", id: "legend"}, bar, text);
}

function select(id, options, value) {  // options: [[value, text], ...]
  const node = el("select", {id});
  for (const [v, text] of options) {
    const o = el("option", {value: String(v)}, text);
    if (String(v) === String(value)) o.selected = true;
    node.appendChild(o);
  }
  return node;
}

function tokenView() {
  const box = el("div", {id: "tokens"});
  const recorded = DATA.runs.map((run, i) => [i, run]).filter(([, run]) => run.rollouts);
  if (!recorded.length) {
    box.appendChild(el("div", {class: "missing"}, "No rollouts were recorded in " +
      (DATA.runs.length > 1 ? "these runs" : "this run") + " (see above): there are no tokens to show."));
    return box;
  }
  const state = {run: recorded[0][0], quantity: "advantage", prompt: null, step: null};
  const controls = el("div", {class: "controls"});
  const body = el("div", {});
  box.append(controls, body);

  function redraw() {
    const run = DATA.runs[state.run], lines = run.rollouts;
    const steps = [...new Set(lines.map((r) => r.step))].sort((a, b) => a - b);
    const prompts = [...new Set(lines.map((r) => r.prompt_index))].sort((a, b) => a - b);
    if (!prompts.includes(state.prompt)) state.prompt = prompts[0];
    if (!steps.includes(state.step)) state.step = steps[steps.length - 1];
    const critic = lines.some((r) => r.value);
    if (state.quantity === "value" && !critic) state.quantity = "advantage";
    const q = QUANTITIES[state.quantity], scale = scaleOf(lines, q);
    const promptText = (p) => (lines.find((r) => r.prompt_index === p) || {}).prompt || "";
    const promptName = (p) => {  // an episode's opening may be the same for every seed
      const r = lines.find((r) => r.prompt_index === p) || {};
      return promptText(p) + (r.seed !== undefined ? ` (episode seed ${r.seed})` : "");
    };

    controls.replaceChildren();
    if (recorded.length > 1) {
      const s = select("pick-run", recorded.map(([i, r]) => [i, r.name]), state.run);
      s.addEventListener("change", () => { state.run = +s.value; redraw(); });
      controls.appendChild(el("label", {}, "run ", s));
    }
    const qs = select("pick-quantity", Object.entries(QUANTITIES).filter(([k]) => k !== "value" || critic)
      .map(([k, v]) => [k, v.label]), state.quantity);
    qs.addEventListener("change", () => { state.quantity = qs.value; redraw(); });
    const ps = select("pick-prompt", prompts.map((p) => [p, `${p + 1}: ${promptName(p)}`]), state.prompt);
    ps.addEventListener("change", () => { state.prompt = +ps.value; redraw(); });
    controls.append(el("label", {}, "colour by ", qs), el("label", {}, "prompt ", ps));

    body.replaceChildren(legend(q, scale, run));
    // one prompt at the first, middle and last eval, side by side
    const shown = [...new Set([steps[0], steps[Math.floor((steps.length - 1) / 2)], steps[steps.length - 1]])];
    body.appendChild(el("h3", {}, "This prompt at the first, middle and last eval"));
    body.appendChild(el("div", {class: "prompt"}, "prompt: ", promptName(state.prompt)));
    const columns = el("div", {class: "columns", id: "columns"});
    shown.forEach((step, c) => {
      const label = shown.length === 1 ? "" : c === 0 ? "first eval, " : c === shown.length - 1 ? "last eval, " : "middle, ";
      const column = el("div", {class: "column"}, el("div", {class: "head"}, `${label}step ${step}`));
      const members = lines.filter((r) => r.step === step && r.prompt_index === state.prompt)
        .sort((a, b) => a.member - b.member);
      for (const r of members) {
        column.appendChild(el("div", {class: "response"},
          members.length > 1 ? el("div", {class: "note"}, `response ${r.member + 1} of the group`) : null,
          responseTokens(r, q, scale), facts(r, q, state.quantity)));
      }
      columns.appendChild(column);
    });
    body.appendChild(columns);

    // every recorded response of one eval
    const ss = select("pick-step", steps.map((s) => [s, String(s)]), state.step);
    ss.addEventListener("change", () => { state.step = +ss.value; redraw(); });
    body.appendChild(el("h3", {}, "Every recorded response at the eval of step ", ss));
    const table = el("table", {class: "all", id: "all-responses"},
      el("tr", {}, el("th", {}, "prompt"), el("th", {}, "response"), el("th", {}, "figures")));
    for (const r of lines.filter((r) => r.step === state.step)) {
      table.appendChild(el("tr", {}, el("td", {class: "prompt"}, r.prompt),
        el("td", {}, responseTokens(r, q, scale)), el("td", {}, facts(r, q, state.quantity))));
    }
    body.appendChild(table);
  }
  redraw();
  return box;
}

// ---------------------------------------------------------------------------- the page
const report = document.getElementById("report");
report.append(
  el("h2", {}, "The run" + (DATA.runs.length > 1 ? "s" : "") + ": final comparison and options"),
  runSummaries(),
  el("h2", {}, "Curves"),
  el("p", {class: "note"}, "Lines: every iteration's rollouts; dots: the held-out evals. Hover for values."),
  curves(),
  el("h2", {}, "Tokens: what each token of a response was credited or charged"),
  el("p", {class: "note"}, "At every eval the run records the same held-out prompts (rollouts.jsonl), " +
     "with what the trainer computed for each token of the responses."),
  tokenView());
document.body.setAttribute("data-ready", "yes");
