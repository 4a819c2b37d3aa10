// The operator's console (src/admin/console/mod.rs): every figure and every action is the admin
// API's own call with the token the operator typed, kept in this tab's sessionStorage only.
'use strict';

const WORDS = {
  en: {
    state: 'State', queue_opens: 'Queue opens', starts: 'Starts', ends: 'Ends', lane: 'Stock', remaining: 'Remaining',
    pending: 'Pending', confirmed: 'Confirmed', halt: 'Halt', resume: 'Resume',
    restock: 'Restock', count: 'Count (optional)', units: 'Units', variant: 'Variant',
    all: 'the activity', wrong: 'The admin API refused this token (401). Type it again.',
    failed: 'The admin API answered {status}: {message}', done: '{action}: done.',
    unsure: '{action}: the admin API answered {status} ({message}). It may have been applied: read the figures before you try again.',
    unsure_count: '{action}: the admin API answered {status} ({message}). The count may have been set: read the activity (its fence panel) before you count again; a count is set once per loss.',
    unreachable: 'The gateway did not answer; retrying every second.',
    updated: 'Updated {time}; {n} activities.',
    fenced_lost: 'Fenced: the store lost sales ({why}): it holds {held} reservation records, this gateway saw {seen}. Nothing sells until a count.',
    next_lost: 'Next step: count the units no order holds (reconcile with --orders), then Resume with that count (the form below, or the command).',
    fenced_master: 'Fenced: the Redis master changed (recorded {recorded}, answering now {current}). Nothing sells meanwhile.',
    next_master: 'Next step: check that the new master holds every sale (reconcile with --orders); if it does, Resume; if not, Resume with the count.',
    next_sizes: 'Each size is fenced and counted on its own: give a lost size its count with that size picked. The sizes share the buyers\' units: if Redis lost those (it was emptied), a count is refused (409) and the runbook\'s next step is to sell what is left under a new activity id.',
    orders_check: 'The last reconcile --orders ({time}): {read} orders read ({elsewhere} of other activities); of this one, {confirmed} confirmed, {pending} pending, {in_doubt} in doubt, {released} released after the sale, {unknown} unknown to Redis (forgotten). A check from before this fence says nothing of it.',
    orders_none: 'No reconcile --orders is recorded for it yet: run the first command below.',
    store_unknown: 'Redis did not answer this gateway: the figures are unknown (—), nothing is sold meanwhile.',
    sold_out_mark: 'sold out', no_units: '— (no unit left)',
    start_kept: 'the waiting room keeps this start: starts_at {configured} in the configuration is not applied, its queue had opened',
    halt_all: 'Halt every activity', confirm_halt_all: 'Halt every activity ({ids}): every gateway of the fleet stops taking stock for them within a second. Buyers are told unavailable (503) and may retry; nothing is given back.',
    fleet: 'Gateways that answered in the last {secs} s: {n}', fleet_stale: '(read {secs} s ago: this gateway cannot write to Redis)', fleet_row: '{host} (gateway {id}) · admin {admin} · seen {ago} s ago · config {generation}',
    states: {scheduled: 'scheduled', pre_queue: 'pre-queue', selling: 'selling', sold_out: 'sold out', halted: 'halted',
      fenced: 'fenced', ended: 'ended'},
    confirm_halt: 'Halt {id}: every gateway of the fleet stops taking stock for it within a second. Buyers are told unavailable (503) and may retry; nothing is given back.',
    confirm_resume: 'Resume {id}: every gateway sells it again.',
    confirm_count: 'Resume {id}{variant} with a count of {n}: the units no order holds, as flashgate reconcile --orders counted them. The stock is set to {n} and every gateway sells it again.',
    confirm_restock: 'Restock {id}{variant}: add {n} units to the version on sale, for the whole fleet.',
    bad_count: 'A count is a whole number from 0 up.',
    count_too_many: 'A count of {n} is more than this stock ever had ({most}: its stock plus what was restocked): the API would refuse it. Count again.', bad_units: 'Units are a whole number from 1 up.',
    queue: 'Waiting room', waiting: 'Waiting', admitted: 'Cursor (places reached)', rate: 'Admissions a second',
    clear: 'Clears in', paused: 'paused', pause_queue: 'Pause the queue', resume_queue: 'Resume the queue',
    set_rate: 'Set the rate', bad_rate: 'A rate is a whole number from 1 up.',
    refusals: 'Refusals in the last {secs} s, on this gateway', no_refusals: 'none',
    confirm_pause: 'Pause the waiting room of {id}: nobody more is admitted (every gateway) until it is resumed; waiting buyers keep their place and read that it is paused.',
    confirm_unpause: 'Resume the waiting room of {id}: admissions go on at {rate} a second.',
    confirm_rate: 'Admit {n} buyers a second to {id}, for the whole fleet, from now on.',
  },
  zh: {
    state: '状态', queue_opens: '排队开始', starts: '开始', ends: '结束', lane: '库存', remaining: '剩余',
    pending: '待确认', confirmed: '已确认', halt: '停售', resume: '恢复',
    restock: '补货', count: '数量（可选）', units: '件数', variant: '规格',
    all: '整个活动', wrong: '管理接口拒绝了此令牌（401）。请重新输入。',
    failed: '管理接口返回 {status}：{message}', done: '{action}：已完成。',
    unsure: '{action}：管理接口返回 {status}（{message}）。操作可能已生效：请先查看数据再重试。',
    unsure_count: '{action}：管理接口返回 {status}（{message}）。数量可能已经设置：请先查看该活动（隔离面板）再清点；每次丢失只能设置一次数量。',
    unreachable: '网关没有响应；每秒重试一次。',
    updated: '更新于 {time}；共 {n} 个活动。',
    fenced_lost: '已隔离：存储丢失了销售记录（{why}）：现有 {held} 条预留记录，本网关曾见到 {seen} 条。清点前不会售出任何商品。',
    next_lost: '下一步：清点没有订单占用的件数（reconcile 加 --orders），然后用该数量恢复（下方表单或命令）。',
    fenced_master: '已隔离：Redis 主节点已更换（记录的是 {recorded}，现在应答的是 {current}）。在此期间不会售出。',
    next_master: '下一步：确认新的主节点保有全部销售（reconcile 加 --orders）；若是，直接恢复；若否，用清点的数量恢复。',
    next_sizes: '每个规格分别隔离、分别清点：为丢失的规格选中它再填数量。各规格共用买家的已购件数：若 Redis 丢失了它们（被清空），清点会被拒绝（409），按运维手册，剩余的商品须以新的活动 id 销售。',
    orders_check: '最近一次 reconcile --orders（{time}）：读取订单 {read} 个（其他活动的 {elsewhere} 个）；本活动中已确认 {confirmed}，待确认 {pending}，存疑 {in_doubt}，售后被释放 {released}，Redis 中没有记录（已遗忘）{unknown}。早于本次隔离的检查不能说明本次情况。',
    orders_none: '尚无 reconcile --orders 的记录：请先运行下方第一条命令。',
    store_unknown: 'Redis 没有响应本网关：数据未知（—），在此期间不会售出。',
    sold_out_mark: '已售罄', no_units: '—（已无库存）',
    start_kept: '排队室保持此开始时间：配置中的 starts_at {configured} 未生效，因为排队已开始',
    halt_all: '停售全部活动', confirm_halt_all: '停售全部活动（{ids}）：整个网关集群在一秒内停止为其扣减库存。买家会收到“暂时不可用”（503），可以重试；不会退回任何东西。',
    fleet: '最近 {secs} 秒内有响应的网关：{n} 个', fleet_stale: '（{secs} 秒前读取：本网关无法写入 Redis）', fleet_row: '{host}（网关 {id}）· 管理 {admin} · {ago} 秒前 · 配置 {generation}',
    states: {scheduled: '未开始', pre_queue: '预排队', selling: '销售中', sold_out: '已售罄', halted: '已停售',
      fenced: '已隔离', ended: '已结束'},
    confirm_halt: '停售 {id}：整个网关集群在一秒内停止为其扣减库存。买家会收到“暂时不可用”（503），可以重试；不会退回任何东西。',
    confirm_resume: '恢复 {id}：所有网关重新开始销售。',
    confirm_count: '以数量 {n} 恢复 {id}{variant}：即 flashgate reconcile --orders 清点出的没有订单占用的件数。库存设为 {n}，所有网关重新开始销售。',
    confirm_restock: '为 {id}{variant} 补货：为正在销售的版本增加 {n} 件，对整个集群生效。',
    bad_count: '数量须为 0 或更大的整数。',
    count_too_many: '数量 {n} 超过了该库存的最大值（{most}：原库存加补货）：管理接口会拒绝。请重新清点。', bad_units: '件数须为 1 或更大的整数。',
    queue: '排队室', waiting: '排队中', admitted: '游标（已轮到的位置）', rate: '每秒放行',
    clear: '预计清空', paused: '已暂停', pause_queue: '暂停排队', resume_queue: '恢复排队',
    set_rate: '设置速率', bad_rate: '速率须为 1 或更大的整数。',
    refusals: '最近 {secs} 秒本网关的拒绝', no_refusals: '无',
    confirm_pause: '暂停 {id} 的排队室：在恢复前（所有网关）不再放行任何人；排队的买家保留位置，并看到已暂停。',
    confirm_unpause: '恢复 {id} 的排队室：以每秒 {rate} 人继续放行。',
    confirm_rate: '从现在起，整个集群每秒为 {id} 放行 {n} 位买家。',
  },
};
const LANG = document.documentElement.lang === 'zh' ? 'zh' : 'en';
const W = WORDS[LANG];
const KEY = 'flashgate-admin-token';
// The name the operator gave at sign-in, for the gateway's log of admin calls (a label).
const OPERATOR = 'flashgate-operator';
let timer = null;
// Each activity's waiting room as last read (only those that have one).
const queues = new Map();
// This gateway's decision counters (its /metrics, read every 5 s), a minute of readings: the
// refusals by code over the last minute are the newest reading less the oldest. Approximation:
// one gateway's, not the fleet's (Grafana sums the fleet); a gateway restarted within the
// minute counts from its start.
const readings = [];
const REFUSALS_EVERY_MS = 5000;
let lastReading = 0;
// Whether the last poll got no answer (its message is cleared by the next answer).
let unreachable = false;
// The activities as last read (the emergency stop halts these).
let shown = [];

function say(template, values) {
  return template.replace(/\{(\w+)\}/g, (_, k) => (k in values ? String(values[k]) : ''));
}
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}
function status(text) {
  document.getElementById('status').textContent = text;
}

async function api(method, path, body, extra) {
  const token = sessionStorage.getItem(KEY);
  if (!token) return {status: 401, json: null};
  const headers = {Authorization: 'Bearer ' + token, 'X-Flashgate-Client': 'console', ...extra};
  const operator = sessionStorage.getItem(OPERATOR);
  if (operator) headers['X-Flashgate-Operator'] = encodeURIComponent(operator);
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(path, {method, headers, cache: 'no-store', credentials: 'omit',
    body: body === undefined ? undefined : JSON.stringify(body)});
  let json = null;
  try { json = await r.json(); } catch (e) { json = null; }
  return {status: r.status, json};
}

// The activity's state as the admin view tells it, by this browser's clock for its hours.
function stateOf(a) {
  const now = Date.now();
  if (a.fenced) return 'fenced';
  if (a.halted) return 'halted';
  if (now >= Date.parse(a.ends_at)) return 'ended';
  if (now < Date.parse(startOf(a))) {
    return a.queue_opens_at && now >= Date.parse(a.queue_opens_at) ? 'pre_queue' : 'scheduled';
  }
  if (a.sold_out) return 'sold_out';
  return 'selling';
}
function time(iso) {
  return new Date(iso).toLocaleString(LANG === 'zh' ? 'zh-CN' : undefined);
}
function figure(v) {
  return v === null || v === undefined ? '—' : String(v);
}

// The activity's stock lanes: each variant's, or the activity's own (id null).
function lanes(a) {
  if (Array.isArray(a.variants) && a.variants.length > 0) {
    return a.variants.map((v) => ({id: v.id, title: v.title, stock: v.stock,
      restocked: v.restocked, remaining: v.remaining,
      pending: v.pending, confirmed: v.confirmed, sold_out: v.sold_out, fenced: v.fenced}));
  }
  return [{id: null, title: null, stock: a.stock, restocked: a.restocked,
    remaining: a.remaining, pending: a.pending,
    confirmed: a.confirmed, sold_out: a.sold_out, fenced: a.fenced}];
}
// A lane's row heading: its title and id, and whether it is sold out.
function laneName(l) {
  const name = l.id === null ? W.all : (l.title && l.title !== l.id ? l.title + ' (' + l.id + ')' : l.id);
  return l.sold_out === true ? name + ' · ' + W.sold_out_mark : name;
}
// Whether Redis answered for the view: its figures are null when the store could not say.
function storeAnswered(a) {
  return lanes(a).every((l) => l.remaining !== null && l.remaining !== undefined);
}

function card(a) {
  const state = stateOf(a);
  const id = a.id;
  const box = el('article', {class: 'activity state-' + state, 'data-activity': id,
    'aria-labelledby': 'title-' + id});
  box.append(el('h3', {id: 'title-' + id}, id, ' ',
    el('span', {class: 'state', 'data-state': state}, W.states[state])));
  box.append(el('p', {class: 'times'}, timesText(a)));
  if (a.fenced) box.append(fence(a));
  const unknown = el('p', {class: 'unknown', role: 'note', 'data-store-unknown': ''}, W.store_unknown);
  unknown.hidden = storeAnswered(a);
  box.append(unknown);
  const table = el('table', {});
  table.append(el('thead', {}, el('tr', {}, el('th', {scope: 'col'}, W.lane),
    el('th', {scope: 'col'}, W.remaining), el('th', {scope: 'col'}, W.pending),
    el('th', {scope: 'col'}, W.confirmed))));
  const body = el('tbody', {});
  for (const l of lanes(a)) {
    body.append(el('tr', {'data-lane': l.id === null ? '' : l.id},
      el('th', {scope: 'row'}, laneName(l)),
      el('td', {'data-figure': 'remaining'}, figure(l.remaining)),
      el('td', {'data-figure': 'pending'}, figure(l.pending)),
      el('td', {'data-figure': 'confirmed'}, figure(l.confirmed))));
  }
  table.append(body);
  box.append(table);
  const q = queues.get(id);
  if (q) box.append(queuePanel(a, q));
  box.append(el('p', {class: 'refusals', 'data-refusals': ''}, refusalsText(id)));
  box.append(actions(a));
  enable(box, a);
  return box;
}

// Offers only what the state allows: Halt while not halted, Resume while halted, fenced or
// refused (a count is refused otherwise), the queue's Pause while it runs and its Resume while paused.
// The API refuses the rest anyway; this keeps a button from promising it.
function enable(c, a) {
  const q = queues.get(a.id);
  const off = {
    halt: !!a.halted,
    resume: !a.halted && !a.fenced && !a.refused,
    'queue-pause': !!(q && q.paused),
    'queue-resume': !(q && q.paused),
  };
  for (const [action, disabled] of Object.entries(off)) {
    const b = c.querySelector(`button[data-action="${action}"]`);
    if (b && b.disabled !== disabled) b.disabled = disabled;
  }
}

// `flashgate_admission_decisions_total` of the Prometheus text, as {activity: {code: n}}.
function decisions(text) {
  const out = {};
  const line = /^flashgate_admission_decisions_total\{([^}]*)\} (\d+)/;
  for (const l of text.split('\n')) {
    const m = line.exec(l);
    if (!m) continue;
    const labels = {};
    for (const p of m[1].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[p[1]] = p[2];
    if (!labels.activity || !labels.decision) continue;
    (out[labels.activity] = out[labels.activity] || {})[labels.decision] = Number(m[2]);
  }
  return out;
}

async function readRefusals() {
  if (Date.now() - lastReading < REFUSALS_EVERY_MS) return;
  lastReading = Date.now();
  const r = await fetch('/metrics', {cache: 'no-store', credentials: 'omit'});
  if (r.status !== 200) return;
  readings.push({at: Date.now(), counts: decisions(await r.text())});
  while (readings.length > 2 && readings[1].at <= Date.now() - 60000) readings.shift();
}

function refusalsText(id) {
  if (readings.length < 2) return say(W.refusals, {secs: 0}) + ': ' + W.no_refusals;
  const first = readings[0];
  const last = readings[readings.length - 1];
  const secs = Math.round((last.at - first.at) / 1000);
  const now = last.counts[id] || {};
  const then = first.counts[id] || {};
  const parts = [];
  for (const [code, n] of Object.entries(now)) {
    if (code === 'admitted' || code === 'passthrough' || code === 'queued') continue;
    const d = n - (then[code] || 0);
    if (d > 0) parts.push(code + ' ' + d);
  }
  return say(W.refusals, {secs}) + ': ' + (parts.length ? parts.join(' · ') : W.no_refusals);
}

// The queue view's `length` is the tickets issued and not yet reached: who waits. `cursor` is
// the last place reached (it moves with the rate even while nobody queues).
// Nobody more is served once no unit is left (the waiting read sold out), and nobody before
// the start: the time to clear counts from the start, at the rate.
function clearsIn(q, a) {
  const waiting = q.length;
  if (waiting === 0) return '0 s';
  if (a && a.sold_out === true) return W.no_units;
  if (q.paused || !q.admit_per_second) return '—';
  const untilStart = Math.max(0, (q.starts_at_ms || 0) - (q.redis_time_ms || 0)) / 1000;
  const secs = Math.ceil(untilStart + waiting / q.admit_per_second);
  return secs < 120 ? secs + ' s' : Math.ceil(secs / 60) + ' min';
}

function queueFigures(q, a) {
  return {waiting: String(q.length), admitted: String(q.cursor),
    rate: String(q.admit_per_second) + (q.paused ? ' (' + W.paused + ')' : ''),
    clear: clearsIn(q, a)};
}

// The sale's start as it stands: the waiting room's (a start moved earlier after its queue
// opened is not applied, and the YAML's is then not the one that holds).
function startOf(a) {
  const q = queues.get(a.id);
  return q && q.starts_at_ms ? new Date(q.starts_at_ms).toISOString() : a.starts_at;
}

function timesText(a) {
  const opens = a.queue_opens_at && a.queue_opens_at !== a.starts_at ?
    W.queue_opens + ': ' + time(a.queue_opens_at) + ' · ' : '';
  const start = startOf(a);
  const kept = Math.abs(Date.parse(start) - Date.parse(a.starts_at)) >= 1000 ?
    ' (' + say(W.start_kept, {configured: time(a.starts_at)}) + ')' : '';
  return opens + W.starts + ': ' + time(start) + kept + ' · ' + W.ends + ': ' + time(a.ends_at);
}

// The waiting room's figures and its controls (pause, resume, the rate).
function queuePanel(a, q) {
  const id = a.id;
  const box = el('section', {class: 'queue', 'aria-label': W.queue + ' ' + id});
  box.append(el('h4', {}, W.queue));
  const list = el('dl', {});
  const f = queueFigures(q, a);
  for (const k of ['waiting', 'admitted', 'rate', 'clear']) {
    list.append(el('div', {}, el('dt', {}, W[k]), el('dd', {'data-queue': k}, f[k])));
  }
  box.append(list);
  const path = `/v1/activities/${encodeURIComponent(id)}/queue`;
  const pause = el('button', {type: 'button', class: 'danger', 'data-action': 'queue-pause'},
    W.pause_queue);
  pause.addEventListener('click', () => act(id, say(W.confirm_pause, {id}), W.pause_queue, 'POST',
    path + '/pause'));
  const unpause = el('button', {type: 'button', 'data-action': 'queue-resume'}, W.resume_queue);
  unpause.addEventListener('click', () => act(id, say(W.confirm_unpause, {id,
    rate: (queues.get(id) || q).admit_per_second}), W.resume_queue, 'POST', path + '/resume'));
  const rateId = 'rate-' + id;
  const rate = el('input', {type: 'number', min: '1', step: '1', id: rateId, inputmode: 'numeric'});
  const set = el('button', {type: 'button', 'data-action': 'queue-rate'}, W.set_rate);
  set.addEventListener('click', () => {
    const raw = rate.value.trim();
    if (!/^\d+$/.test(raw) || Number(raw) < 1) return status(W.bad_rate);
    act(id, say(W.confirm_rate, {id, n: raw}), W.set_rate, 'POST',
      path + '/rate?per_second=' + encodeURIComponent(raw));
  });
  box.append(el('div', {class: 'row'}, pause, unpause),
    el('div', {class: 'row'}, el('label', {for: rateId}, W.rate), rate, set));
  return box;
}

// The runbook's reconcile command for `a` (orders.txt: the backend's order ids, one a line).
function reconcile(a) {
  return `flashgate reconcile --config gateway.yaml --activity ${a.id} --orders orders.txt`;
}

// The runbook's resume command for `a`; with a count (and the lane's variant) for a loss.
function resumeCommand(a, lane) {
  const data = lane === undefined ? '' : ` -H 'Content-Type: application/json' -d '` +
    JSON.stringify(lane === null ? {remaining: 'N'} : {remaining: 'N', variant: lane})
      .replace('"N"', 'N') + `'`;
  return `curl -X POST -H "Authorization: Bearer $FLASHGATE_ADMIN_TOKEN"${data} ` +
    `${location.origin}/v1/activities/${encodeURIComponent(a.id)}/resume`;
}

// Why the activity is fenced (each fenced size's why, on a drop with sizes), and the
// runbook's next step with its commands filled in: every command runs as written.
function fence(a) {
  const box = el('div', {class: 'fenced', role: 'note'});
  const sized = lanes(a).some((l) => l.id !== null);
  const fenced = lanes(a).filter((l) => l.fenced);
  const commands = [reconcile(a)];
  let lost = false;
  let master = false;
  for (const l of fenced) {
    const f = l.fenced;
    const who = sized ? laneName(l) + ': ' : '';
    if (f.lost) {
      lost = true;
      box.append(el('p', {}, who + say(W.fenced_lost, {why: f.lost, held: f.held, seen: f.seen})));
      commands.push(resumeCommand(a, l.id));
    } else {
      master = true;
      box.append(el('p', {}, who + say(W.fenced_master, {recorded: f.recorded || '—',
        current: f.current || '—'})));
    }
  }
  if (master) commands.push(resumeCommand(a));
  box.append(el('p', {}, lost ? W.next_lost : W.next_master));
  const c = a.orders_check;
  box.append(el('p', {'data-orders-check': ''}, c ? say(W.orders_check, {...c,
    time: new Date(c.at_ms).toLocaleString(LANG === 'zh' ? 'zh-CN' : undefined)}) : W.orders_none));
  if (sized) box.append(el('p', {}, W.next_sizes));
  box.append(el('pre', {}, commands.join('\n')));
  return box;
}

function variantPicker(a, name) {
  const ids = lanes(a).map((l) => l.id).filter((v) => v !== null);
  if (ids.length === 0) return null;
  const pick = el('select', {id: name + '-' + a.id, name: 'variant'});
  for (const v of ids) pick.append(el('option', {value: v}, v));
  return [el('label', {for: name + '-' + a.id}, W.variant), pick];
}

function actions(a) {
  const id = a.id;
  const form = el('div', {class: 'actions'});
  const halt = el('button', {type: 'button', class: 'danger', 'data-action': 'halt',
    'aria-label': W.halt + ' ' + id}, W.halt);
  halt.addEventListener('click', () => act(id, say(W.confirm_halt, {id}), W.halt,
    'POST', `/v1/activities/${encodeURIComponent(id)}/halt`));
  const countId = 'count-' + id;
  const count = el('input', {type: 'number', min: '0', step: '1', id: countId, inputmode: 'numeric'});
  const resumeVariant = variantPicker(a, 'resume-variant');
  const resume = el('button', {type: 'button', 'data-action': 'resume',
    'aria-label': W.resume + ' ' + id}, W.resume);
  resume.addEventListener('click', () => {
    const raw = count.value.trim();
    const path = `/v1/activities/${encodeURIComponent(id)}/resume`;
    if (raw === '') return act(id, say(W.confirm_resume, {id}), W.resume, 'POST', path);
    if (!/^\d+$/.test(raw)) return status(W.bad_count);
    const body = {remaining: Number(raw)};
    const lane = lanes(a).find((l) => l.id === (resumeVariant ? resumeVariant[1].value : null));
    const most = lane && lane.stock + (lane.restocked || 0);
    if (lane && Number.isInteger(lane.stock) && body.remaining > most) {
      return status(say(W.count_too_many, {n: raw, most}));
    }
    let variant = '';
    if (resumeVariant) {
      body.variant = resumeVariant[1].value;
      variant = ' / ' + body.variant;
    }
    // No Try again for a count: sent again after another loss, it would count that one.
    act(id, say(W.confirm_count, {id, variant, n: raw}), W.resume, 'POST', path, body,
      {retry: false});
  });
  const unitsId = 'units-' + id;
  const units = el('input', {type: 'number', min: '1', step: '1', id: unitsId, inputmode: 'numeric'});
  const restockVariant = variantPicker(a, 'restock-variant');
  const restock = el('button', {type: 'button', 'data-action': 'restock',
    'aria-label': W.restock + ' ' + id}, W.restock);
  restock.addEventListener('click', () => {
    const raw = units.value.trim();
    if (!/^\d+$/.test(raw) || Number(raw) < 1) return status(W.bad_units);
    const body = {add: Number(raw)};
    let variant = '';
    if (restockVariant) {
      body.variant = restockVariant[1].value;
      variant = ' / ' + body.variant;
    }
    act(id, say(W.confirm_restock, {id, variant, n: raw}), W.restock, 'POST',
      `/v1/activities/${encodeURIComponent(id)}/restock`, body);
  });
  form.append(el('div', {class: 'row'}, halt));
  const resumeRow = el('div', {class: 'row'}, el('label', {for: countId}, W.count), count);
  if (resumeVariant) resumeRow.append(...resumeVariant);
  resumeRow.append(resume);
  const restockRow = el('div', {class: 'row'}, el('label', {for: unitsId}, W.units), units);
  if (restockVariant) restockRow.append(...restockVariant);
  restockRow.append(restock);
  form.append(resumeRow, restockRow);
  return form;
}

// Asks in the dialog, in the runbook's words; on Confirm, makes the API's call for activity `id`.
// Each confirmation is one call with its own Idempotency-Key (a restock adds its units once
// however often it is sent): an answer that leaves it unsure (5xx, no answer) offers to send
// the very same call again.
function act(id, text, name, method, path, body, opts) {
  const key = {'Idempotency-Key': 'console-' + crypto.randomUUID()};
  const retry = !opts || opts.retry !== false;
  confirmThen(text, () => send(id, name, method, path, body, key, retry));
}

// Shows `text` in the confirmation dialog (Cancel focused); runs `then` on Confirm.
function confirmThen(text, then) {
  const dialog = document.getElementById('confirm');
  document.getElementById('confirm-text').textContent = text;
  const ok = document.getElementById('confirm-ok');
  const cancel = document.getElementById('confirm-cancel');
  const close = () => {
    ok.onclick = null;
    cancel.onclick = null;
    dialog.close();
  };
  cancel.onclick = close;
  ok.onclick = () => {
    close();
    then();
  };
  dialog.showModal();
  cancel.focus();
}

// The emergency stop: every activity the view lists that is not halted yet, halted one call
// each (the fleet-wide halt of each); the status names any the API did not halt.
function haltAll() {
  const ids = shown.filter((a) => !a.halted).map((a) => a.id);
  if (ids.length === 0) return;
  confirmThen(say(W.confirm_halt_all, {ids: ids.join(', ')}), async () => {
    const failed = [];
    for (const id of ids) {
      const r = await api('POST', `/v1/activities/${encodeURIComponent(id)}/halt`).catch(() => ({status: 0}));
      if (r.status === 401) return signedOut(W.wrong);
      if (r.status !== 200) failed.push(id + ' (' + (r.status || '—') + ')');
    }
    status(failed.length ? say(W.failed, {status: '', message: failed.join(', ')}) :
      say(W.done, {action: W.halt_all}));
    refresh();
  });
}

// How long Try again is offered: past it, the figures have moved on and the operator reads
// them before acting again.
const RETRY_OFFERED_MS = 60000;
let retryTimer = null;

async function send(id, name, method, path, body, key, retry) {
  const again = document.getElementById('retry');
  again.hidden = true;
  again.onclick = null;
  clearTimeout(retryTimer);
  let r;
  try {
    r = await api(method, path, body, key);
  } catch (e) {
    r = {status: 0, json: {message: W.unreachable}};
  }
  if (r.status === 401) return signedOut(W.wrong);
  const message = (r.json && r.json.message) || '';
  if (r.status >= 200 && r.status < 300) {
    status(say(W.done, {action: name}));
    // A figure typed for this action is not kept for the next one (other cards' stay).
    const card = document.querySelector(`article[data-activity="${CSS.escape(id)}"]`);
    for (const input of card ? card.querySelectorAll('input') : []) input.value = '';
  } else if ((r.status >= 500 || r.status === 0) && !retry) {
    status(say(W.unsure_count, {action: name, status: r.status || '—', message}));
  } else if (r.status >= 500 || r.status === 0) {
    status(say(W.unsure, {action: name, status: r.status || '—', message}));
    again.hidden = false;
    again.onclick = () => send(id, name, method, path, body, key, retry);
    retryTimer = setTimeout(() => { again.hidden = true; again.onclick = null; }, RETRY_OFFERED_MS);
  } else {
    status(say(W.failed, {status: r.status, message}));
  }
  refresh();
}

// Draws each activity's card once and then updates its figures in place, so that an input the
// operator is typing in (or a list they opened) is never replaced under them; a card whose
// sizes changed (a reload) is drawn again.
function redraw(list) {
  const box = document.getElementById('activities');
  const cards = new Map();
  for (const c of box.children) cards.set(c.dataset.activity, c);
  const next = [];
  for (const a of list) {
    const shape = JSON.stringify([lanes(a).map((l) => l.id), !!queues.get(a.id)]);
    let c = cards.get(a.id);
    if (!c || c.dataset.shape !== shape) {
      c = card(a);
      c.dataset.shape = shape;
    } else {
      update(c, a);
    }
    next.push(c);
  }
  if (next.length !== box.children.length || next.some((c, i) => box.children[i] !== c)) {
    box.replaceChildren(...next);
  }
  document.getElementById('empty').hidden = true;
}

function update(c, a) {
  const state = stateOf(a);
  c.className = 'activity state-' + state;
  const badge = c.querySelector('.state');
  badge.dataset.state = state;
  badge.textContent = W.states[state];
  for (const l of lanes(a)) {
    const row = c.querySelector(`tbody tr[data-lane="${CSS.escape(l.id === null ? '' : l.id)}"]`);
    const heading = row && row.querySelector('th');
    if (heading && heading.textContent !== laneName(l)) heading.textContent = laneName(l);
    for (const k of ['remaining', 'pending', 'confirmed']) {
      const cell = row && row.querySelector(`td[data-figure="${k}"]`);
      if (cell && cell.textContent !== figure(l[k])) cell.textContent = figure(l[k]);
    }
  }
  c.querySelector('[data-store-unknown]').hidden = storeAnswered(a);
  const times = c.querySelector('.times');
  if (times.textContent !== timesText(a)) times.textContent = timesText(a);
  enable(c, a);
  const refusals = c.querySelector('[data-refusals]');
  const text = refusalsText(a.id);
  if (refusals && refusals.textContent !== text) refusals.textContent = text;
  const q = queues.get(a.id);
  if (q) {
    const f = queueFigures(q, a);
    for (const k of Object.keys(f)) {
      const cell = c.querySelector(`dd[data-queue="${k}"]`);
      if (cell && cell.textContent !== f[k]) cell.textContent = f[k];
    }
  }
  const old = c.querySelector('.fenced');
  const now = a.fenced ? fence(a) : null;
  if (old && now) {
    if (old.textContent !== now.textContent) old.replaceWith(now);
  } else if (old) {
    old.remove();
  } else if (now) {
    c.querySelector('table').before(now);
  }
}

async function refresh() {
  let r;
  try {
    r = await api('GET', '/v1/activities');
  } catch (e) {
    unreachable = true;
    return status(W.unreachable);
  }
  if (unreachable) {
    unreachable = false;
    status('');
  }
  if (r.status === 401) return signedOut(W.wrong);
  if (r.status !== 200 || !r.json) {
    return status(say(W.failed, {status: r.status, message: (r.json && r.json.message) || ''}));
  }
  await Promise.all([readQueues(r.json.activities), readRefusals().catch(() => {}),
    readFleet().catch(() => {})]);
  shown = r.json.activities;
  redraw(r.json.activities);
  document.getElementById('halt-all').disabled = shown.every((a) => a.halted);
  const n = r.json.activities.length;
  document.getElementById('updated').textContent =
    say(W.updated, {time: new Date().toLocaleTimeString(LANG === 'zh' ? 'zh-CN' : undefined), n});
}

// The waiting rooms of the activities that have one (the view's `queue_opens_at`: a reload
// may add or remove one).
async function readQueues(list) {
  for (const a of list) if (!a.queue_opens_at) queues.delete(a.id);
  await Promise.all(list.filter((a) => a.queue_opens_at).map(async (a) => {
    const r = await api('GET', `/v1/activities/${encodeURIComponent(a.id)}/queue`);
    if (r.status === 200 && r.json) queues.set(a.id, r.json);
    else if (r.status === 404) queues.delete(a.id);
  }));
}

// The fleet's gateways as this gateway last read them from Redis (`GET /v1/fleet`).
async function readFleet() {
  const r = await api('GET', '/v1/fleet');
  const box = document.getElementById('fleet');
  if (r.status !== 200 || !r.json) return;
  const rows = r.json.gateways.map((g) => say(W.fleet_row, {id: String(g.id).slice(0, 8),
    host: g.host || '—', admin: g.admin || '—',
    ago: Math.round(g.seen_ms_ago / 100) / 10, generation: g.generation}));
  const age = r.json.read_age_ms;
  const text = say(W.fleet, {secs: Math.round(r.json.window_ms / 1000), n: rows.length}) +
    (age > 3000 ? ' ' + say(W.fleet_stale, {secs: Math.round(age / 1000)}) : '');
  const key = text + rows.join('|');
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  box.replaceChildren(el('h2', {id: 'fleet-title'}, text),
    el('ul', {}, ...rows.map((row) => el('li', {}, row))));
  box.hidden = false;
}

function signedIn() {
  document.getElementById('sign-in').hidden = true;
  document.getElementById('sign-out').hidden = false;
  document.getElementById('controls').hidden = false;
  refresh();
  if (!timer) timer = setInterval(refresh, 1000);
}

function signedOut(message) {
  sessionStorage.removeItem(KEY);
  queues.clear();
  readings.length = 0;
  lastReading = 0;
  if (timer) clearInterval(timer);
  timer = null;
  document.getElementById('activities').replaceChildren();
  shown = [];
  document.getElementById('controls').hidden = true;
  document.getElementById('retry').hidden = true;
  const fleet = document.getElementById('fleet');
  fleet.replaceChildren();
  fleet.hidden = true;
  delete fleet.dataset.key;
  document.getElementById('updated').textContent = '';
  document.getElementById('empty').hidden = false;
  document.getElementById('sign-in').hidden = false;
  document.getElementById('sign-out').hidden = true;
  status(message || '');
  document.getElementById('token').focus();
}

document.addEventListener('DOMContentLoaded', () => {
  document.getElementById('sign-in').addEventListener('submit', (e) => {
    e.preventDefault();
    const input = document.getElementById('token');
    sessionStorage.setItem(KEY, input.value);
    input.value = '';
    const name = document.getElementById('operator').value.trim();
    if (name) sessionStorage.setItem(OPERATOR, name);
    else sessionStorage.removeItem(OPERATOR);
    status('');
    signedIn();
  });
  document.getElementById('sign-out').addEventListener('click', () => signedOut(''));
  document.getElementById('halt-all').addEventListener('click', haltAll);
  if (sessionStorage.getItem(KEY)) signedIn();
});
