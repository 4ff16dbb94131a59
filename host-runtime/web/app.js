// The conversation page: the host's wire on a WebSocket, the client timeline of
// timeline-core compiled to WebAssembly (timeline.wasm), and the words the host wrote.
// No framework: the reducer decides the rows; this file only carries and draws.
"use strict";

const params = new URLSearchParams(location.search);
const session = params.get("session") || "s1";
let token = params.get("token") || localStorage.getItem("custody-token");
const $ = (id) => document.getElementById(id);

let wasmBytes = null;
let timeline = null; // the page's reducer (one wasm instance)
let ws = null;
let opened = false; // the timeline's target is open
let nextId = 1;
const waiting = new Map(); // request id -> resolve
let timer = null;
let backoff = 250;
let everConnected = false;

// One wasm instance: its own memory, so its own timeline.
async function instance() {
  const { instance } = await WebAssembly.instantiate(wasmBytes, {});
  const x = instance.exports;
  return (command) => {
    const bytes = new TextEncoder().encode(JSON.stringify(command));
    // `input` may grow the memory, which detaches the old buffer: read it after.
    const at = x.input(bytes.length);
    new Uint8Array(x.memory.buffer, at, bytes.length).set(bytes);
    const len = x.call();
    const out = x.output();
    return JSON.parse(new TextDecoder().decode(new Uint8Array(x.memory.buffer, out, len)));
  };
}

function ask(command) {
  const answer = timeline(command);
  if (answer.error) {
    notice("The timeline refused a command: " + answer.error);
    return answer;
  }
  for (const effect of answer.effects) run(effect);
  if (answer.rows) draw(answer.rows);
  if (answer.changes) redraw(answer.changes);
  if (answer.olderCursor !== undefined) $("older").hidden = !answer.olderCursor;
  schedule(answer.timeout);
  status(answer.loadState);
  return answer;
}

// The session's record, rebuilt from the replay a join brings (RB-04): the run's state
// as the host last knew it, whatever relay events the page missed while cut off.
let replays = 0;
function record(command) {
  const answer = timeline(command);
  if (answer.error) {
    notice("The timeline refused a command: " + answer.error);
    return answer;
  }
  for (const effect of answer.effects) {
    // A damaged or incomplete replay: join again for a new one.
    if (effect.kind === "requestReplay") rpc("run.chatJoin", { appSessionId: session });
  }
  if (answer.outcome === "complete") {
    replays++;
    const shown = document.body.dataset.run;
    if (answer.running) document.body.dataset.run = "running";
    else if (shown === "running") document.body.dataset.run = "idle"; // its end was missed
  }
  schedule(answer.timeout);
  return answer;
}

function schedule(at) {
  clearTimeout(timer);
  if (at !== null && at !== undefined) {
    timer = setTimeout(() => ask({ cmd: "timeout", now: Date.now() }), Math.max(0, at - Date.now()));
  }
}

function notice(text) {
  const n = $("notice");
  n.textContent = text;
  n.hidden = !text;
}

function status(state) {
  const connected = ws && ws.readyState === WebSocket.OPEN;
  let text = connected ? "connected" : "reconnecting";
  if (state && state.failed) text += " · history unavailable";
  if (state && state.loading !== undefined) text += " · loading";
  $("status").textContent = text;
}

// ----- the wire ------------------------------------------------------------------------

function rpc(method, params) {
  return new Promise((resolve) => {
    if (!ws || ws.readyState !== WebSocket.OPEN) {
      resolve({ errorCode: "UNAVAILABLE", message: "not connected" });
      return;
    }
    const id = nextId++;
    waiting.set(id, resolve);
    ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
  });
}

function answerOf(frame) {
  if (frame.error) {
    const code = frame.error.data && frame.error.data.errorCode;
    return { errorCode: code || "INTERNAL_ERROR", message: frame.error.message };
  }
  return { ok: frame.result };
}

function run(effect) {
  const now = () => Date.now();
  switch (effect.kind) {
    case "loadLatestWindow":
      rpc("run.chatLoad", { appSessionId: session, pageSize: effect.pageSize }).then((a) =>
        ask({ cmd: "window", tag: effect.tag, answer: a, now: now() }));
      break;
    case "loadOlderPage": {
      const p = { appSessionId: session, beforeCursor: effect.beforeCursor, pageSize: effect.pageSize };
      if (effect.expectedBoundaryToken) p.expectedBoundaryToken = effect.expectedBoundaryToken;
      rpc("run.chatLoadPageBefore", p).then((a) =>
        ask({ cmd: "older", tag: effect.tag, answer: a, now: now() }));
      break;
    }
    case "loadAnchored":
      rpc("run.chatLoad", { appSessionId: session, anchor: effect.anchor }).then((a) =>
        ask({ cmd: "anchored", tag: effect.tag, answer: a, now: now() }));
      break;
    case "stopPaging":
      $("older").hidden = true;
      break;
    case "receiptOverdue":
      notice("This device could not confirm that the host saved your message. Reload before sending it again.");
      break;
  }
}

function onNotification(frame) {
  if (frame.method === "structured_replay") {
    record({ cmd: "replayChunk", chunk: frame.params, now: Date.now() });
    return;
  }
  if (frame.method !== "chat:timeline-updated") return;
  const p = frame.params;
  if (p.appSessionId !== session) return;
  const now = Date.now();
  switch (p.event) {
    case "blocks":
      ask({ cmd: "live", target: p.timelineTargetId, overlay: p.liveOverlay, now });
      break;
    case "blocks-patch":
      ask({ cmd: "patch", target: p.timelineTargetId, patch: p.livePatch, now });
      break;
    case "started":
      document.body.dataset.run = "running";
      break;
    case "completed":
    case "failed":
    case "aborted":
      document.body.dataset.run = p.event;
      break;
  }
}

function connect() {
  const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws?token=" + encodeURIComponent(token);
  ws = new WebSocket(url);
  let open = false;
  ws.onopen = async () => {
    open = true;
    everConnected = true;
    backoff = 250;
    status();
    // Interest in the session (its relay events), then the timeline: opened the first
    // time, reloaded after a cut so nothing missed while away stays missing.
    const joined = await rpc("run.chatJoin", { appSessionId: session });
    if (joined.errorCode) notice("Could not join the session: " + joined.message);
    if (!opened) {
      opened = true;
      ask({ cmd: "open", target: session, now: Date.now() });
    } else {
      ask({ cmd: "reload", now: Date.now() });
    }
  };
  ws.onmessage = (event) => {
    const frame = JSON.parse(event.data);
    if (frame.id !== undefined && frame.id !== null && !frame.method) {
      const resolve = waiting.get(frame.id);
      waiting.delete(frame.id);
      if (resolve) resolve(answerOf(frame));
    } else if (frame.method) {
      onNotification(frame);
    }
  };
  ws.onclose = () => {
    for (const resolve of waiting.values()) resolve({ errorCode: "UNAVAILABLE", message: "disconnected" });
    waiting.clear();
    status();
    if (!open && !everConnected) {
      // Refused before it opened: not paired (or revoked).
      localStorage.removeItem("custody-token");
      $("pairing").hidden = false;
      $("status").textContent = "not paired";
      return;
    }
    setTimeout(connect, backoff);
    backoff = Math.min(backoff * 2, 5000);
  };
}

// ----- drawing -------------------------------------------------------------------------

const DECISION_WORDS = {
  accept: "Allow", acceptForSession: "Allow for this session", acceptBroadly: "Allow broadly",
  decline: "Deny", cancel: "Cancel",
};

const shown = new Map(); // "type:id" -> { origin, block }, the rows on the page
const nodes = new Map(); // "type:id" -> the row's element
const keyOf = (k) => k.type + ":" + k.id;

// Every row again (a window applied, a target opened).
function draw(rows) {
  const main = $("timeline");
  const atEnd = main.scrollTop + main.clientHeight >= main.scrollHeight - 20;
  const list = document.createDocumentFragment();
  shown.clear();
  nodes.clear();
  for (const row of rows) {
    const k = keyOf(row.block);
    const div = rowNode(row);
    shown.set(k, row);
    nodes.set(k, div);
    list.append(div);
  }
  main.replaceChildren(list);
  if (atEnd) main.scrollTop = main.scrollHeight;
}

// Only the rows that changed (a streamed token touches one): each taken out, and put
// back after the row the timeline names, which is already in place. Each is found by
// its key, so the cost follows the changes, not the rows shown.
function redraw(changes) {
  const main = $("timeline");
  const atEnd = main.scrollTop + main.clientHeight >= main.scrollHeight - 20;
  for (const { key, row, after } of changes) {
    const k = keyOf(key);
    const old = nodes.get(k);
    if (old) old.remove();
    shown.delete(k);
    nodes.delete(k);
    if (!row) continue;
    const div = rowNode(row);
    shown.set(k, row);
    nodes.set(k, div);
    const before = after ? nodes.get(keyOf(after)) : null;
    if (before) before.after(div);
    else main.prepend(div);
  }
  if (atEnd) main.scrollTop = main.scrollHeight;
}

function rowNode({ origin, block }) {
  const div = document.createElement("div");
  div.className = "row";
  div.dataset.key = block.type + ":" + block.id;
  div.dataset.type = block.type;
  div.dataset.origin = origin;
  const data = block.data || {};
  if (data.title) {
    const t = document.createElement("span");
    t.className = "title";
    t.textContent = data.title;
    div.append(t);
    if (data.subtitle) div.append(" — " + data.subtitle);
  }
  if (data.text) div.append((data.title ? "\n" : "") + data.text);
  if (data.label) div.append(data.label);
  const signal = data.display && data.display.signal;
  if (signal) {
    const s = document.createElement("span");
    s.className = "signal";
    s.textContent = signal;
    div.append(s);
  }
  if (data.approval) drawApproval(div, data.approval);
  return div;
}

function drawApproval(div, approval) {
  div.dataset.approval = approval.status;
  if (approval.status !== "pending") return;
  const box = document.createElement("div");
  box.className = "decisions";
  for (const decision of approval.allowed) {
    const b = document.createElement("button");
    b.textContent = DECISION_WORDS[decision] || decision;
    b.dataset.decision = decision;
    b.onclick = () => decide(approval, decision);
    box.append(b);
  }
  div.append(box);
}

async function decide(approval, decision) {
  const a = await rpc("run.chatResolveApproval", {
    requestId: approval.requestId, threadId: approval.threadId, turnId: approval.turnId,
    itemId: approval.itemId, decision, idempotencyKey: "approval-" + crypto.randomUUID(),
  });
  if (a.errorCode === "APPROVAL_ALREADY_RESOLVED") notice("This request was already decided on another device.");
  else if (a.errorCode) notice(a.message);
  return a;
}

// ----- the composer and pairing --------------------------------------------------------

async function send(event) {
  event.preventDefault();
  const text = $("text").value;
  if (!text.trim()) return;
  $("text").value = "";
  const uuid = crypto.randomUUID();
  const op = "op-" + uuid;
  const now = Date.now();
  ask({ cmd: "pending", operationId: op, createdAt: now, data: { text } });
  ask({ cmd: "awaitReceipt", operationId: op, now });
  const a = await rpc("run.chatOutboxSubmit", {
    appSessionId: session, queueId: "q-" + uuid, operationId: op, userText: text,
    source: "browser", createdAt: now, intent: "automatic", sendMode: "queue",
    idempotencyKey: op,
  });
  if (a.ok) {
    ask({ cmd: "confirm", operationId: op });
  } else if (a.errorCode !== "UNAVAILABLE" && a.errorCode !== "DISPATCH_TIMEOUT") {
    // Refused: never saved, so the echo goes and the words come back to the composer.
    ask({ cmd: "removePending", operationId: op });
    $("text").value = text;
    notice(a.message);
  }
}

async function pair(event) {
  event.preventDefault();
  const r = await fetch("pair", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ code: $("code").value, deviceName: $("device").value }),
  });
  const body = await r.json();
  if (!r.ok) {
    notice(body.message);
    return;
  }
  token = body.token;
  localStorage.setItem("custody-token", token);
  $("pairing").hidden = true;
  notice("");
  everConnected = false;
  connect();
}

async function start() {
  $("session").textContent = session;
  $("composer").onsubmit = send;
  $("pairing").onsubmit = pair;
  $("older").onclick = () => ask({ cmd: "loadOlder", now: Date.now() });
  wasmBytes = await (await fetch("timeline.wasm")).arrayBuffer();
  timeline = await instance();
  ask({ cmd: "new", mode: "phone", changes: true });
  if (token) {
    localStorage.setItem("custody-token", token);
    connect();
  } else {
    $("pairing").hidden = false;
    $("status").textContent = "not paired";
  }
}

// For tests: replay language-neutral vectors through a wasm instance of their own; the
// rows after each step, as the reducer gives them.
window.custody = {
  async replay(vector) {
    const own = await instance();
    return vector.steps.map((step) => {
      const a = own(step.command);
      return [a.rows || null, a.changes || null];
    });
  },
  cut() { if (ws) ws.close(); },
  // The record rebuilt from replays: how many, and its rows.
  record() { return { replays, rows: timeline({ cmd: "view" }).rows }; },
  // What a decision button does, for a card this page shows with another status.
  decide(status, decision) {
    const row = [...shown.values()].find((r) => r.block.data && r.block.data.approval && r.block.data.approval.status === status);
    return decide(row.block.data.approval, decision);
  },
};

// Errors a test (or a person with the console open) can read.
const errors = [];
window.addEventListener("error", (e) => errors.push(String(e.message)));
window.addEventListener("unhandledrejection", (e) => errors.push(String(e.reason)));
window.custody.errors = errors;

start().catch((e) => errors.push(String(e)));
