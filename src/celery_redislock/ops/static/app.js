// The web view's page: reads /api/entries every second, counts leases down
// between reads, and frees a hold when the server allows it (--allow-release).
// Lock names come from task arguments: everything shown is set as text
// (textContent), never parsed as HTML.
"use strict";

const POLL_MS = 1000;
const TICK_MS = 100;
const TOKEN_KEY = "celery-redislock-release-token";
const COLUMNS = ["kind", "name", "holder", "host", "pid", "fence", "lease", "held", "waiters", "parked"];
const NUMERIC = new Set(["pid", "fence", "lease", "held", "waiters", "parked"]);
const col = Object.fromEntries(COLUMNS.map((name, i) => [name, i]));

const $ = (id) => document.getElementById(id);
const rows = new Map(); // kind, name and hold -> its <tr>, kept across reads
const state = new WeakMap(); // <tr> -> what it shows: {kind, name, holder, who, ttl, held}
let readAt = 0; // performance.now() when the last read arrived
let lastSeq = 0;
let seq = 0;
let timer = 0;
let readFailed = false;

function say(text, error = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", error);
}

function duration(ms) {
  const s = Math.max(0, ms) / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  const h = Math.floor(m / 60);
  const pad = (n) => String(n).padStart(2, "0");
  if (h < 1) return `${m}m ${pad(Math.floor(s % 60))}s`;
  if (h < 48) return `${h}h ${pad(m % 60)}m`;
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

function who(h) {
  if (h.task_name && h.task_id) return `${h.task_name}[${h.task_id}]`;
  return h.task_id || h.token;
}

// The holds of an entry, one row each: a lock's holder, a semaphore's
// permits, a read-write lock's sides, a unique key's jobs; an entry without
// any still gets a row (its waiters, parked runs and fence).
function holds(entry) {
  if (entry.kind === "unique") {
    const u = entry.unique || {};
    const jobs = [
      ["waiting", u.waiting, u.waiting_ttl_ms],
      ["running", u.running, u.running_ttl_ms],
      ["throttled by", u.throttled_by, u.throttle_ttl_ms],
    ].filter(([, id]) => id);
    // A unique key is let go as a whole: one release, on its first row.
    return jobs.map(([what, id, ttl], i) => ({
      key: `${what} ${id}`, who: `${what} ${id}`, ttl, releasable: i === 0, holder: null,
    }));
  }
  return entry.holders.map((h) => ({
    key: h.token,
    who: who(h),
    task: h.task_name && h.task_id ? [h.task_name, `[${h.task_id}]`] : null,
    mode: h.mode,
    host: h.parked ? "in flight" : h.hostname,
    pid: h.pid,
    fence: h.fence,
    ttl: h.ttl_ms,
    held: h.held_ms,
    releasable: true,
    holder: h.token, // frees exactly this hold, never one taken since
  }));
}

function kindText(entry, hold) {
  if (entry.kind === "semaphore" && entry.limit !== null) return `semaphore (${entry.limit})`;
  if (entry.kind === "rwlock" && hold.mode) return `rwlock · ${hold.mode}`;
  return entry.kind;
}

function newRow() {
  const tr = document.createElement("tr");
  for (const name of COLUMNS) {
    const td = tr.insertCell();
    td.className = name + (NUMERIC.has(name) ? " num" : "");
  }
  const button = document.createElement("button");
  button.type = "button";
  button.textContent = "release";
  button.addEventListener("click", () => release(tr));
  tr.insertCell().appendChild(button);
  return tr;
}

function fill(tr, entry, hold, first) {
  const c = tr.cells;
  const text = (name, value) => {
    c[col[name]].textContent = value === null || value === undefined ? "" : String(value);
  };
  text("kind", kindText(entry, hold));
  text("name", entry.name);
  if (hold.task) {
    // The task's name, then its id, dimmed (where a narrow row breaks).
    const [name, id] = [document.createElement("span"), document.createElement("span")];
    name.textContent = hold.task[0];
    id.textContent = hold.task[1];
    id.className = "id";
    c[col.holder].replaceChildren(name, id);
  } else {
    text("holder", hold.who);
  }
  text("host", hold.host);
  text("pid", hold.pid);
  text("fence", hold.fence === undefined ? entry.fence : hold.fence);
  const writers = entry.writers_waiting ? ` (${entry.writers_waiting} write)` : "";
  text("waiters", first ? `${entry.waiters}${writers}` : "");
  text("parked", first ? entry.parked : "");
  tr.classList.toggle("same", !first);
  const action = c[COLUMNS.length];
  action.hidden = !canRelease();
  action.firstChild.hidden = !hold.releasable;
  state.set(tr, {
    kind: entry.kind, name: entry.name, holder: hold.holder, who: hold.who,
    ttl: hold.ttl, held: hold.held,
  });
}

// Between reads, leases count down and holds age from the last read.
function tick() {
  const elapsed = performance.now() - readAt;
  for (const tr of rows.values()) {
    const s = state.get(tr);
    const lease = tr.cells[col.lease];
    const left = s.ttl === null || s.ttl === undefined ? null : s.ttl - elapsed;
    lease.textContent = left === null ? "" : left > 0 ? duration(left) : "expired";
    lease.classList.toggle("short", left !== null && left > 0 && left < 2000);
    lease.classList.toggle("gone", left !== null && left <= 0);
    const held = s.held === null || s.held === undefined ? null : s.held + elapsed;
    tr.cells[col.held].textContent = held === null ? "" : duration(held);
  }
}

function canRelease() {
  return document.body.dataset.release === "yes";
}

function summary(stats) {
  const sum = (o) => Object.values(o).reduce((a, b) => a + b, 0);
  return `${sum(stats.counts)} names · ${sum(stats.held)} held · ${stats.holders} holders · ` +
    `${stats.waiters} waiting · ${stats.parked} parked`;
}

function render(data) {
  readAt = performance.now();
  document.body.dataset.release = data.release ? "yes" : "no";
  $("store").textContent = (data.store ? `${data.store} · ` : "") + `prefix ${data.prefix}`;
  $("summary").textContent = summary(data.stats);
  $("release-token").hidden = !data.release;
  document.querySelector("th.release").hidden = !data.release;
  const body = $("rows");
  const seen = new Set();
  let index = 0;
  for (const entry of data.entries) {
    const list = holds(entry);
    if (list.length === 0) list.push({ key: "", releasable: false, holder: null });
    list.forEach((hold, i) => {
      const key = JSON.stringify([entry.kind, entry.name, hold.key]);
      seen.add(key);
      let tr = rows.get(key);
      if (!tr) rows.set(key, (tr = newRow()));
      fill(tr, entry, hold, i === 0);
      // (Moved only when out of place: a moved button loses focus.)
      if (body.children[index] !== tr) body.insertBefore(tr, body.children[index] || null);
      index += 1;
    });
  }
  for (const [key, tr] of rows) {
    if (!seen.has(key)) {
      tr.remove();
      rows.delete(key);
    }
  }
  $("empty").hidden = rows.size > 0;
  tick();
}

async function read() {
  clearTimeout(timer);
  const mine = ++seq;
  try {
    const res = await fetch("/api/entries", { cache: "no-store" });
    const data = await res.json();
    if (!res.ok) throw new Error(data.error || res.statusText);
    if (mine > lastSeq) {
      lastSeq = mine;
      render(data);
    }
    document.body.classList.remove("stale");
    if (readFailed) say("");
    readFailed = false;
  } catch (err) {
    document.body.classList.add("stale");
    readFailed = true;
    say(`Cannot read the lock store: ${err.message}`, true);
  } finally {
    if (mine === seq) timer = setTimeout(read, POLL_MS);
  }
}

async function release(tr) {
  const s = state.get(tr);
  const token = $("token").value.trim();
  if (!token) {
    say("Paste the release token (printed when the web view started) first.", true);
    $("token").focus();
    return;
  }
  const what = `${s.kind} “${s.name}”` + (s.holder ? ` held by ${s.who}` : "");
  if (!window.confirm(`Release ${what}?\n\nIts fence is raised: a fenced store refuses the holder's later writes.`)) {
    return;
  }
  let answer;
  try {
    const res = await fetch("/api/release", {
      method: "POST",
      cache: "no-store",
      headers: {
        "Content-Type": "application/json",
        "Authorization": `Bearer ${token}`,
        "X-Redislock": "release",
      },
      body: JSON.stringify({ kind: s.kind, name: s.name, holder: s.holder }),
    });
    answer = await res.json();
    if (!res.ok) throw new Error(answer.error || res.statusText);
  } catch (err) {
    say(`Release refused: ${err.message}`, true);
    return;
  }
  const freed = answer.released.some((r) => r.freed.length > 0 || r.unique_job);
  const fences = answer.released.map((r) => r.fence).filter((f) => f !== null);
  const fence = fences.length ? `; fence now ${fences.join(", ")}` : "";
  say(freed ? `Released ${what}${fence}.` : `Nothing freed: ${what} was no longer held${fence}.`);
  read();
}

function takeToken() {
  const input = $("token");
  const found = /[#&]token=([^&]*)/.exec(location.hash);
  if (found) {
    try {
      sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(found[1]));
    } catch (err) {
      say(`The token in the address is not readable: ${err.message}`, true);
    }
    // Out of the address bar (and of the history, and of screenshots).
    history.replaceState(null, "", location.pathname + location.search);
  }
  input.value = sessionStorage.getItem(TOKEN_KEY) || "";
  input.addEventListener("input", () => sessionStorage.setItem(TOKEN_KEY, input.value.trim()));
}

takeToken();
read();
setInterval(tick, TICK_MS);
