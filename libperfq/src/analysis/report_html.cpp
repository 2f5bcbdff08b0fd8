// report_to_html(): the report as one self-contained page
// (`perfqctl report --html`).  The page carries the very JSON document of
// report_to_json() (one analysis, two renderings) and a script that lays it
// out top to bottom and draws its charts with Chart.js, inlined with it: the
// page fetches nothing when it is opened.  Every figure shown is marked with
// the JSON path it comes from (data-json), so a test can hold the page to
// the JSON.
#include "perfq/report.h"

#include <string>

namespace perfq {

namespace {

// Inside <script>: the text must not close the element.  In the JSON, '<'
// only occurs in strings, where \u003c is the same character.
std::string json_for_script(const std::string& json) {
  std::string out;
  out.reserve(json.size());
  for (char c : json) {
    if (c == '<') {
      out += "\\u003c";
    } else {
      out += c;
    }
  }
  return out;
}

// A script's source inside <script>: "</script" would end it early.
std::string js_for_script(std::string_view js) {
  std::string out(js);
  for (size_t p = out.find("</"); p != std::string::npos; p = out.find("</", p + 3))
    out.replace(p, 2, "<\\/");
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

constexpr std::string_view kStyle = R"css(
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1100px; padding: 1em 2em; color: #222; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; border-bottom: 1px solid #ccc; margin-top: 2em; }
h3 { font-size: 1.05em; margin-bottom: 0.3em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { padding: 2px 10px; text-align: right; border-bottom: 1px solid #eee; }
th:first-child, td:first-child { text-align: left; }
th { background: #f4f4f4; }
.chart { position: relative; height: 300px; margin: 0.5em 0 1.5em; }
.note { color: #666; font-size: 0.92em; }
.warn { color: #a00; font-weight: 600; }
code { background: #f4f4f4; padding: 0 3px; }
)css";

// Lays the report out from the JSON in #perfq-report.  Numbers are shown
// with their units; each carries data-json="path.in.the.json".
constexpr std::string_view kScript = R"js(
'use strict';
(function () {
// Correlation ids are 64-bit: read them as their digits (JSON.parse source
// text access), not as doubles that would round them.
const R = JSON.parse(document.getElementById('perfq-report').textContent,
                     (k, v, ctx) => (k === 'corr_id' && ctx && ctx.source ? ctx.source : v));
const app = document.getElementById('app');
Chart.defaults.animation = false;
Chart.defaults.maintainAspectRatio = false;
const COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2',
                '#7f7f7f', '#bcbd22', '#17becf'];
const color = (i) => COLORS[i % COLORS.length];

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}
function add(parent, tag, attrs, ...children) {
  const e = el(tag, attrs, ...children);
  parent.append(e);
  return e;
}
function fmtNs(ns) {
  const a = Math.abs(ns);
  if (a >= 1e9) return (ns / 1e9).toFixed(3) + ' s';
  if (a >= 1e6) return (ns / 1e6).toFixed(3) + ' ms';
  if (a >= 1e3) return (ns / 1e3).toFixed(3) + ' \u00b5s';
  return Math.round(ns) + ' ns';
}
function fmtCount(n) { return Number(n).toLocaleString('en-US'); }
function fmtRate(r) { return Number(r).toFixed(1) + ' /s'; }
function fmtBytesPerS(b) { return (b / 1e9).toFixed(3) + ' GB/s'; }
// Bytes in decimal units, as link speeds are given (GB = 1e9 bytes).
function fmtBytes(b) {
  const a = Math.abs(b);
  for (const [u, f] of [['TB', 1e12], ['GB', 1e9], ['MB', 1e6], ['kB', 1e3]])
    if (a >= f) return (b / f).toFixed(3) + ' ' + u;
  return Math.round(b) + ' B';
}
function fmtShare(x) { return (x * 100).toFixed(2) + ' %'; }
function fmtPpm(p) { return Number(p).toFixed(3) + ' ppm'; }
// A figure with the JSON path it shows.
function fig(path, text) { return el('span', {'data-json': path}, text); }
function ns(path, v) { return fig(path, fmtNs(v)); }
function count(path, v) { return fig(path, fmtCount(v)); }
function table(parent, head, rows) {
  const t = add(parent, 'table');
  const tr = add(add(t, 'thead'), 'tr');
  for (const h of head) add(tr, 'th', {}, h);
  const tb = add(t, 'tbody');
  for (const r of rows) {
    const row = add(tb, 'tr');
    for (const c of r) add(row, 'td', {}, c);
  }
  return t;
}
function section(title) {
  const s = add(app, 'section');
  add(s, 'h2', {}, title);
  return s;
}
function note(parent, text, cls) { return add(parent, 'p', {class: cls || 'note'}, text); }
let charts = 0;
function chart(parent, config, label) {
  const box = add(parent, 'div', {class: 'chart'});
  const canvas = add(box, 'canvas', {'aria-label': label, role: 'img', 'data-chart': label});
  ++charts;
  return new Chart(canvas, config);
}
function logNsTicks() {
  return {callback: (v) => {
    const l = Math.log10(v);
    return Math.abs(l - Math.round(l)) < 1e-9 ? fmtNs(v) : '';
  }};
}
const sourceName = (id) => {
  const s = R.sources.find((x) => x.id === id);
  return s ? s.name : 'source ' + id;
};

// ---- Header -----------------------------------------------------------------
document.title = 'perfq report: ' + R.file;
add(app, 'h1', {}, 'perfq report');
add(app, 'p', {}, el('code', {}, R.file), R.stopped_early ? ' \u2014 ' : '',
    R.stopped_early ? el('span', {class: 'warn', 'data-json': 'stopped_early.reason'},
                         'trace damaged: ' + R.stopped_early.reason) : '');
for (const p of R.problems || [])
  add(app, 'p', {}, el('span', {class: 'warn'}, 'trace damaged: ' + p.reason));

// ---- The trace --------------------------------------------------------------
{
  const s = section('The trace');
  table(s, ['', ''], [
    ['host', fig('host.name', R.host.name)],
    ['kernel', fig('host.kernel', R.host.kernel)],
    ['CPU', fig('host.cpu', R.host.cpu)],
    ['perfq', fig('host.perfq_version', R.host.perfq_version)],
    ['duration (' + R.duration_of + ')', ns('duration_ns', R.duration_ns)],
    ['records', count('records.total', R.records.total)],
    ['records of the host', count('records.host', R.records.host)],
    ['records of devices', count('records.device', R.records.device)],
    ['lost on the host', count('lost.host', R.lost.host)],
    ['lost on devices', count('lost.device', R.lost.device)],
    ['jobs out of causal order', count('causality_violations', R.causality_violations)],
  ]);
  const rows = R.sources.map((src, i) => {
    const link = src.pci && src.pci.pcie ? src.pci.pcie.link_current : null;
    return [fig('sources.' + i + '.name', src.name), fig('sources.' + i + '.kind', src.kind),
            fig('sources.' + i + '.pci_address', src.pci_address || '\u2014'),
            fig('sources.' + i + '.link', src.link || '\u2014'),
            link ? fig('sources.' + i + '.pci.pcie.link_current.ceiling_bytes_per_s',
                       fmtBytesPerS(link.ceiling_bytes_per_s))
                 : 'not known'];
  });
  add(s, 'h3', {}, 'Sources');
  table(s, ['name', 'kind', 'PCI address', 'link', 'link ceiling (each direction)'], rows);
  add(s, 'h3', {}, 'Clock synchronization per device');
  if (R.sync.devices.length === 0) note(s, 'No device in this trace.');
  table(s, ['device', 'standing', 'offset (device ahead)', 'drift', 'claimed bound',
            'worst claimed bound', 'sync samples', 'models'],
        R.sync.devices.map((d, i) => {
          const p = 'sync.devices.' + i + '.';
          return [fig(p + 'name', d.name),
                  d.synchronized ? fig(p + 'standing', d.standing)
                                 : el('span', {class: 'warn'}, 'not synchronized'),
                  d.synchronized ? ns(p + 'device_ahead_ns', d.device_ahead_ns) : '\u2014',
                  d.synchronized ? fig(p + 'device_fast_ppm', fmtPpm(d.device_fast_ppm)) : '\u2014',
                  ns(p + 'uncertainty_ns', d.uncertainty_ns),
                  ns(p + 'worst_uncertainty_ns', d.worst_uncertainty_ns),
                  count(p + 'samples', d.samples), count(p + 'models', d.models)];
        }));
}

// ---- The job chain ----------------------------------------------------------
const PHASES = [['submit_to_start_ns', 'submit \u2192 start'],
                ['start_to_end_ns', 'start \u2192 end'],
                ['end_to_complete_ns', 'end \u2192 complete']];
{
  const s = section('The job chain: host submit \u2192 device start \u2192 device end \u2192 host complete');
  const J = R.jobs;
  add(s, 'p', {}, count('jobs.count', J.count), ' complete jobs; ',
      count('jobs.incomplete', J.incomplete), ' correlation ids without all four events.');
  if (J.count === 0) {
    note(s, 'No complete job in this trace: nothing to break down.');
  } else {
    add(s, 'h3', {}, 'Where the time goes (mean per job)');
    chart(s, {
      type: 'bar',
      data: {labels: ['mean job'],
             datasets: PHASES.map(([k, label], i) => ({label, data: [J[k].mean / 1e3],
                                                       backgroundColor: color(i)}))},
      options: {indexAxis: 'y',
                scales: {x: {stacked: true, title: {display: true, text: 'time (\u00b5s)'}},
                         y: {stacked: true}},
                plugins: {title: {display: true, text: 'mean time per phase, \u00b5s'}}},
    }, 'breakdown');
    table(s, ['phase', 'jobs', 'min', 'p50', 'p90', 'p99', 'max', 'mean'],
          PHASES.map(([k, label]) => {
            const p = 'jobs.' + k + '.';
            const d = J[k];
            return [label, count(p + 'count', d.count), ns(p + 'min', d.min), ns(p + 'p50', d.p50),
                    ns(p + 'p90', d.p90), ns(p + 'p99', d.p99), ns(p + 'max', d.max),
                    ns(p + 'mean', d.mean)];
          }));
    PHASES.forEach(([k, label], i) => {
      const h = J.histograms[k];
      const d = J[k];
      add(s, 'h3', {}, label + ': distribution');
      if (h.bins.length === 0) {
        note(s, 'Every value is at or below zero: nothing to show on a log axis.');
        return;
      }
      const total = h.bins.reduce((a, b) => a + b[2], 0) + h.at_most_zero;
      const hist = h.bins.map((b) => ({x: b[0], y: b[2]}));
      hist.push({x: h.bins[h.bins.length - 1][1], y: h.bins[h.bins.length - 1][2]});
      let cum = h.at_most_zero;
      const cdf = [{x: h.bins[0][0], y: cum / total}];
      for (const b of h.bins) {
        cum += b[2];
        cdf.push({x: b[1], y: cum / total});
      }
      const marks = [['p50', d.p50], ['p90', d.p90], ['p99', d.p99], ['max', d.max]]
                        .filter(([, v]) => v > 0)
                        .map(([name, v], j) => ({
                          label: name + ' ' + fmtNs(v), type: 'line', yAxisID: 'cdf',
                          data: [{x: v, y: 0}, {x: v, y: 1}], borderColor: color(j + 3),
                          borderDash: [4, 3], pointRadius: 0, borderWidth: 1.5}));
      chart(s, {
        type: 'line',
        data: {datasets: [
          {label: 'jobs per bin (10 a decade)', data: hist, stepped: 'before', fill: 'origin',
           borderColor: color(i), backgroundColor: color(i) + '40', pointRadius: 0, yAxisID: 'y'},
          {label: 'CDF', data: cdf, borderColor: '#000', pointRadius: 0, yAxisID: 'cdf'},
          ...marks]},
        options: {parsing: false,
                  scales: {x: {type: 'logarithmic', title: {display: true, text: label + ' (log axis)'},
                               ticks: logNsTicks()},
                           y: {type: 'linear', beginAtZero: true, position: 'left',
                               title: {display: true, text: 'jobs per bin'}},
                           cdf: {type: 'linear', min: 0, max: 1, position: 'right',
                                 title: {display: true, text: 'fraction of jobs at or below'},
                                 grid: {drawOnChartArea: false}}},
                  plugins: {title: {display: true, text: label + ': histogram and CDF'}}},
      }, 'hist ' + k);
      if (h.at_most_zero)
        add(s, 'p', {class: 'warn'}, count('jobs.histograms.' + k + '.at_most_zero', h.at_most_zero),
            ' jobs at or below 0 ns (not on the log axis).');
    });
    add(s, 'h3', {}, 'The longest jobs (submit to complete), with their four host times');
    table(s, ['correlation id', 'submit \u2192 complete', 'submit (s from start)', 'start', 'end',
              'complete'],
          J.worst.map((w, i) => {
            const p = 'jobs.worst.' + i + '.';
            const at = (k) => fig(p + k, ((w[k] - R.timeline.start_ns) / 1e9).toFixed(9) + ' s');
            return [fig(p + 'corr_id', String(w.corr_id)), ns(p + 'latency_ns', w.latency_ns),
                    at('submit_ns'), at('start_ns'), at('end_ns'), at('complete_ns')];
          }));
  }
  if (R.causality_violation_list.length) {
    add(s, 'h3', {}, 'Jobs out of causal order beyond their times\' claims');
    add(s, 'p', {class: 'warn'}, count('causality_violations', R.causality_violations),
        ' jobs are out of order by more than the sync bounds allow: a claim was false. The first:');
    table(s, ['correlation id', 'order broken', 'beyond the claims', 'submit', 'start', 'end',
              'complete'],
          R.causality_violation_list.map((v, i) => {
            const p = 'causality_violation_list.' + i + '.';
            const at = (k) => el('span', {}, fig(p + k + '.time_ns',
                                                 ((v[k].time_ns - R.timeline.start_ns) / 1e9).toFixed(9) + ' s'),
                                 ' (' + (v[k].claim_ns === null ? 'no bound' : '\u00b1' + v[k].claim_ns + ' ns') +
                                 ', ' + v[k].converted_by + ')');
            return [fig(p + 'corr_id', String(v.corr_id)), v.step, ns(p + 'beyond_ns', v.beyond_ns),
                    at('submit'), at('start'), at('end'), at('complete')];
          }));
  }
  add(s, 'h3', {}, 'Off-CPU time of the submitting thread');
  if (!R.off_cpu) {
    note(s, 'The trace has no scheduler events of the submitting threads (record with ' +
            '--kernel-events sched to see them).');
  } else {
    const O = R.off_cpu;
    add(s, 'p', {}, count('off_cpu.jobs_off_cpu', O.jobs_off_cpu), ' of ',
        count('off_cpu.jobs', O.jobs), ' jobs had their submitting thread switched out; p50 ',
        ns('off_cpu.off_cpu_ns.p50', O.off_cpu_ns.p50), ', p99 ',
        ns('off_cpu.off_cpu_ns.p99', O.off_cpu_ns.p99), ', max ',
        ns('off_cpu.off_cpu_ns.max', O.off_cpu_ns.max), '.');
    table(s, ['correlation id', 'thread', 'off CPU', 'job latency'], O.worst.map((w, i) => {
      const p = 'off_cpu.worst.' + i + '.';
      return [fig(p + 'corr_id', String(w.corr_id)), fig(p + 'tid', String(w.tid)),
              ns(p + 'off_cpu_ns', w.off_cpu_ns), ns(p + 'latency_ns', w.latency_ns)];
    }));
  }
}

// ---- Over time --------------------------------------------------------------
{
  const s = section('Over time');
  const T = R.timeline;
  const binS = T.bin_ns / 1e9;
  const xs = Array.from({length: T.bins}, (_, i) => (i + 0.5) * binS);
  const series = (v) => v.map((y, i) => ({x: xs[i], y}));
  const timeAxis = {type: 'linear', min: 0, max: T.bins * binS,
                    title: {display: true, text: 'time since the start (s)'}};
  add(s, 'p', {class: 'note'}, 'One time axis for every chart: bins of ', ns('timeline.bin_ns', T.bin_ns),
      ' from the start of the recording (', count('timeline.bins', T.bins), ' bins).');
  if (T.bins === 0) {
    note(s, 'The trace holds no records.');
  } else {
    const name = (x) => x.source_name + ' (' + x.kind + ') stream ' + x.stream;
    chart(s, {
      type: 'line',
      data: {datasets: T.streams.map((x, i) => ({
        label: name(x), data: series(x.records.map((n) => n / binS)), borderColor: color(i),
        pointRadius: 0, borderWidth: 1.2}))},
      options: {parsing: false,
                scales: {x: timeAxis, y: {beginAtZero: true, title: {display: true, text: 'records per second'}}},
                plugins: {title: {display: true, text: 'records per second, per stream'}}},
    }, 'records over time');
    const lossy = T.streams.filter((x) => x.lost.some((n) => n > 0));
    chart(s, {
      type: 'bar',
      data: {labels: xs.map((x) => x.toFixed(3)),
             datasets: (lossy.length ? lossy : [{source_name: 'all streams', kind: 'none lost',
                                                 stream: '', lost: new Array(T.bins).fill(0)}])
                           .map((x, i) => ({label: name(x), data: x.lost, backgroundColor: color(i + 3)}))},
      options: {scales: {x: {stacked: true, title: {display: true, text: 'time since the start (s)'}},
                         y: {stacked: true, beginAtZero: true, title: {display: true, text: 'records lost per bin'}}},
                plugins: {title: {display: true, text: 'losses per bin, per stream'}}},
    }, 'losses over time');
    note(s, 'Device ring fill: this trace does not record it (perfqctl status shows it live).');
    for (const [i, y] of T.sync.entries()) {
      const p = 'timeline.sync.' + i + '.';
      const rounds = y.rounds.reduce((a, b) => a + b, 0);
      const failed = y.failed_rounds.reduce((a, b) => a + b, 0);
      add(s, 'h3', {}, 'Clock sync of ' + y.source_name);
      add(s, 'p', {}, fig(p + 'rounds', fmtCount(rounds)), ' rounds, ',
          fig(p + 'failed_rounds', fmtCount(failed)), ' of them failed (no observation).');
      // On a log axis: a residual of 0 ns has no place there and is left out.
      const pts = (v) => v.map((n, j) => (n === null || n <= 0 ? null : {x: xs[j], y: n}))
                             .filter((q) => q);
      chart(s, {
        type: 'line',
        data: {datasets: [
          {label: 'worst |residual| of a round against the model in force (ns)',
           data: pts(y.worst_residual_ns), borderColor: color(0), showLine: false, pointRadius: 2},
          {label: 'claimed bound of the stored models (ns)', data: pts(y.claimed_bound_ns),
           borderColor: color(3), stepped: 'before', pointRadius: 0},
          {label: 'failed rounds per bin', type: 'bar', data: series(y.failed_rounds),
           backgroundColor: color(1), yAxisID: 'failed'}]},
        options: {parsing: false,
                  scales: {x: timeAxis,
                           y: {type: 'logarithmic', title: {display: true, text: 'ns (log axis)'},
                               ticks: logNsTicks()},
                           failed: {beginAtZero: true, position: 'right', grid: {drawOnChartArea: false},
                                    title: {display: true, text: 'failed rounds per bin'}}},
                  plugins: {title: {display: true, text: y.source_name + ': sync residuals and claimed bound'}}},
      }, 'sync ' + y.source);
    }
  }
}

// ---- Events and durations -------------------------------------------------------
{
  const s = section('Events');
  table(s, ['event', 'source', 'kind', 'count', 'rate'], R.events.map((e, i) => {
    const p = 'events.' + i + '.';
    return [fig(p + 'name', e.name), fig(p + 'source_name', e.source_name), fig(p + 'kind', e.kind),
            count(p + 'count', e.count), fig(p + 'rate_per_s', fmtRate(e.rate_per_s))];
  }));
  add(s, 'h3', {}, 'Counters: their values');
  const fmtNum = (v) => Number(v).toLocaleString('en-US', {maximumFractionDigits: 1});
  const fromStart = (p, ns) => fig(p, ((ns - R.timeline.start_ns) / 1e9).toFixed(9) + ' s');
  const counters = R.events.map((e, i) => [e, i]).filter(([e]) => e.values);
  if (counters.length === 0) note(s, 'No counter in this trace.');
  else
    table(s, ['counter', 'source', 'min', 'at (s from start)', 'mean', 'max', 'at (s from start)'],
          counters.map(([e, i]) => {
            const p = 'events.' + i + '.values.';
            return [e.name, e.source_name, fig(p + 'min', fmtNum(e.values.min)),
                    fromStart(p + 'min_at_ns', e.values.min_at_ns),
                    fig(p + 'mean', fmtNum(e.values.mean)), fig(p + 'max', fmtNum(e.values.max)),
                    fromStart(p + 'max_at_ns', e.values.max_at_ns)];
          }));
  add(s, 'h3', {}, 'Throughput of the events whose arg is a byte count');
  const moved = R.events.map((e, i) => [e, i]).filter(([e]) => e.throughput);
  if (moved.length === 0) {
    note(s, 'No event of this trace declares its arg a byte count (perfq_event_arg() with ' +
            'PERFQ_ARG_BYTES, a device\'s PERFQ_DEV_ARG_BYTES).');
  } else {
    table(s, ['event', 'source', 'calls', 'bytes', 'per call', 'over the recording',
              'share of the link', 'within its ranges', 'share of the link', 'link (each direction)'],
          moved.map(([e, i]) => {
            const p = 'events.' + i + '.throughput.';
            const t = e.throughput;
            const inRange = t.in_range_bytes_per_s > 0;
            return [e.name, e.source_name, count(p + 'calls', t.calls), fig(p + 'bytes', fmtBytes(t.bytes)),
                    fig(p + 'bytes_per_call', fmtBytes(t.bytes_per_call)),
                    fig(p + 'bytes_per_s', fmtBytes(t.bytes_per_s) + '/s'),
                    t.link ? fig(p + 'link.share', fmtShare(t.link.share)) : '\u2014',
                    inRange ? fig(p + 'in_range_bytes_per_s', fmtBytes(t.in_range_bytes_per_s) + '/s')
                            : '\u2014',
                    t.link && inRange ? fig(p + 'link.in_range_share', fmtShare(t.link.in_range_share))
                                      : '\u2014',
                    t.link ? el('span', {}, fig(p + 'link.source_name', t.link.source_name), ' ',
                                fig(p + 'link.link', t.link.link), ', ',
                                fig(p + 'link.ceiling_bytes_per_s', fmtBytesPerS(t.link.ceiling_bytes_per_s)))
                           : t.links_known > 1 ? 'not known: ' + t.links_known + ' devices have link figures'
                                               : 'not known: no link figures'];
          }));
    note(s, 'A call is a begin or an instant: a range\'s bytes are its begin\'s arg. "Within its ' +
            'ranges": the bytes of the ranges that closed over their summed durations, the rate ' +
            'while a transfer is in progress.');
    const links = moved.filter(([e]) => e.throughput.link).map(([e]) => e.throughput.link);
    for (const [e] of moved) {
      const l = e.throughput.link;
      if (l && (l.share > 1 || l.in_range_share > 1))
        note(s, e.name + ' (' + e.source_name + ') is above its link\'s ceiling: these bytes did ' +
                'not all cross it in these times (a copy in host memory, or ranges shorter ' +
                'than the transfers).', 'warn');
    }
    chart(s, {
      type: 'bar',
      data: {labels: moved.map(([e]) => e.name + ' (' + e.source_name + ')'),
             datasets: [
               {label: 'over the recording', data: moved.map(([e]) => e.throughput.bytes_per_s / 1e9),
                backgroundColor: color(0)},
               {label: 'within its ranges', data: moved.map(([e]) => e.throughput.in_range_bytes_per_s / 1e9),
                backgroundColor: color(1)},
               {label: 'its link\'s ceiling', data: moved.map(([e]) => (e.throughput.link
                   ? e.throughput.link.ceiling_bytes_per_s / 1e9 : 0)),
                backgroundColor: color(7) + '80'}]},
      options: {indexAxis: 'y',
                scales: {x: {beginAtZero: true, title: {display: true, text: 'GB/s'}}},
                plugins: {title: {display: true, text: links.length
                  ? 'bytes per second, against the PCIe link\'s ceiling (each direction)'
                  : 'bytes per second (no link figures)'}}},
    }, 'throughput');
  }
  add(s, 'h3', {}, 'Durations of begin/end pairs');
  table(s, ['range', 'source', 'count', 'p50', 'p99', 'max', 'the longest began at (s from start)'],
        R.durations.map((d, i) => {
          const p = 'durations.' + i + '.duration_ns.';
          return [d.name, d.source_name, count(p + 'count', d.duration_ns.count),
                  ns(p + 'p50', d.duration_ns.p50), ns(p + 'p99', d.duration_ns.p99),
                  ns(p + 'max', d.duration_ns.max),
                  fig('durations.' + i + '.max_at_ns',
                      ((d.max_at_ns - R.timeline.start_ns) / 1e9).toFixed(9) + ' s')];
        }));
  add(s, 'h3', {}, 'Ranges inside ranges: their share of the enclosing time');
  if (R.nested.length === 0) note(s, 'No range of this trace closed inside another.');
  else
    table(s, ['range', 'inside', 'source', 'count', 'share of the enclosing time'],
          R.nested.map((n, i) => [n.child, n.parent, n.source_name,
                                  count('nested.' + i + '.count', n.count),
                                  fig('nested.' + i + '.share', (n.share * 100).toFixed(1) + ' %')]));
  note(s, 'The figures are those of perfqctl report --json on the same trace; the JSON is in this ' +
          'page (the script element #perfq-report).');
}
document.body.setAttribute('data-charts', String(charts));
})();
)js";

}  // namespace

std::string report_to_html(const TraceReport& r, std::string_view chartjs) {
  std::string out;
  out.reserve(chartjs.size() + 64 * 1024);
  out +=
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>perfq "
      "report: ";
  out += html_escape(r.path);
  out += "</title>\n<style>";
  out += kStyle;
  out += "</style>\n<script>\n";
  out += js_for_script(chartjs);
  out += "\n</script>\n</head>\n<body>\n<main id=\"app\"></main>\n";
  out += "<script type=\"application/json\" id=\"perfq-report\">\n";
  out += json_for_script(report_to_json(r));
  out += "</script>\n<script>";
  out += js_for_script(kScript);
  out += "</script>\n</body>\n</html>\n";
  return out;
}

}  // namespace perfq
