/*
 * The raftcron dashboard: plain JavaScript, no framework, no build step.
 *
 * Every few seconds it asks the node that served the page for
 *   GET /v1/cluster     this node, the leader, term, commit/applied index, the members
 *   GET /v1/schedules   next fire, recent fires, skipped and misfired counts
 *   GET /v1/jobs        the job search (live and archived jobs by any field, payload fields
 *                       included; paged with next_cursor) and the dead letter (failed)
 *   GET /v1/jobs/{id}   one job's page, live or archived, with the schedule that fired it
 *                       (GET /v1/schedules/{name}) and the jobs of its workflow (GET /v1/jobs
 *                       over its creation time: a workflow's jobs are created together)
 *   GET /v1/events      fires, skips, expired leases, dead letters, leader changes
 *   GET /v1/queues      queue limits, paused queues, queued/running and held-back jobs
 *   GET /v1/settings    the state against its budget (its `usage`): bytes, finished jobs kept
 *                       by outcome, evictions by reason, the largest queues; or that the
 *                       cluster is not finalized, so has no budget yet
 *   GET /metrics        the job counters that rates are computed from, and the notifications'
 *                       delivery figures (pending, delivered, lost, this node's POSTs)
 *   GET /v1/activity    the charts' samples (jobs per second by queue, claim latency), which
 *                       this node takes every few seconds; only the ones after the last seen
 *                       (since_ms), all again when the node restarted (its started_ms changed).
 *                       charts.js draws them.
 * and, for each other member, that member's own GET /v1/cluster at its http_address (for its
 * applied index). The browser may refuse that (no CORS headers, or the address is not reachable
 * from here): the member's row then falls back to what this node knows, or shows "?".
 * GET /v1/notifications (the receivers' URLs and events) is asked only when the notifications
 * /metrics names change, or on "reload": it is an admin read, every admin read is a record in
 * the audit trail, and a page asking every second would flood it.
 *
 * Rules it keeps: data from the API is put in the page as text, never as HTML; an API error is
 * shown in the page (the last good data stays, marked stale), never a blank page; a 401 asks for
 * the token once and keeps it in sessionStorage (this tab only); a write carries a request_id
 * and is retried with the same id on a 503, which the cluster answers with the first result.
 */
"use strict";

(() => {
  // -- settings ------------------------------------------------------------------------------

  const TOKEN_KEY = "raftcron.token";
  const REFRESH_S_DEFAULT = 2;
  const REQUEST_TIMEOUT_MS = 8000;
  const MEMBER_TIMEOUT_MS = 1500;
  const MEMBER_RETRY_MS = 30000; // a member the browser could not ask is asked again after this
  const RATE_WINDOW_MS = 10000; // rates are averaged over about this long
  const JOBS_PAGE = 50;
  const PAGE_MAX = 1000; // the most jobs one GET /v1/jobs answers (cluster/http/bounds.py)
  // A workflow's jobs get consecutive ids (scheduler/workflows.py), at most this many
  // (scheduler/limits.py): all of them lie within this distance of any one of them.
  const WORKFLOW_JOBS_MAX = 1000;
  const WORKFLOW_PAGES_MAX = 6; // requests one read of a workflow sends at most
  // The job search's filters, as GET /v1/jobs names them; payload: [[path, value], ...].
  const NO_FILTERS = Object.freeze({
    status: "", task: "", queue: "", schedule: "", key: "", worker: "", error: "", archived: "",
    created_from_ms: "", created_to_ms: "", finished_from_ms: "", finished_to_ms: "",
    payload: Object.freeze([]),
  });
  const TEXT_FILTERS = ["task", "queue", "schedule", "key", "worker", "error"];
  const TIME_FILTERS = ["created_from_ms", "created_to_ms", "finished_from_ms", "finished_to_ms"];
  const BULK_FILTERS = ["status", "queue", "task", "schedule"]; // what POST /v1/jobs/bulk takes
  const EVENTS_KEPT = 100;
  const QUEUE_CHARTS_MAX = 6; // the busiest queues of the charts' window get a chart each
  const CHART_SPAN_MIN_MS = 60000; // the charts show at least this long, however new the node
  const CHART_COUNTERS = [
    ["submitted", "submitted"], ["succeeded", "succeeded"], ["failed", "failed (dead letter)"],
  ];
  const WRITE_TRIES = 5;
  const COUNTERS = ["submitted", "claimed", "succeeded", "failed", "retried", "cancelled"];
  const FINAL = new Set(["succeeded", "failed", "cancelled"]);
  // From this share of its budget the state is a warning, as for `raftcron cluster doctor` (its
  // --budget-warn-pct default); app.css draws the mark there (.gauge-mark). At 100% new jobs
  // are refused (507 state_full) once nothing finished is left to evict.
  const BUDGET_WARN_PCT = 80;
  const MiB = 1024 * 1024;
  const STATE_QUEUES_SHOWN = 5;
  const EVICTION_REASONS = {
    age: "older than retention's max_age_ms",
    count: "past retention's max_count",
    budget: "for space: the state was over its budget (oldest first, dead letters last)",
  };

  // -- page state ----------------------------------------------------------------------------

  const state = {
    token: sessionStorage.getItem(TOKEN_KEY),
    tokenNeeded: false, // a 401 came back and no new token was given yet
    tokenSeen: false, // this node uses tokens (a 401 was seen, or a token is stored)
    refreshS: REFRESH_S_DEFAULT,
    timer: null,
    busy: false,
    lastOkMs: null,
    clockOffsetMs: 0, // the replicated clock minus this browser's clock, when they differ much
    cluster: null,
    probes: new Map(), // node_id -> {atMs, view} or {atMs, error}
    counterSamples: [], // [{atMs, counters: Map("counter|queue" -> value)}]
    errors: new Map(), // source -> message
    jobs: {filters: {...NO_FILTERS}, cursors: [null], page: 0, next: null},
    selectedJobId: null,
    bulk: null, // {action, filter} of the last count, which the confirm button acts on
    metricsRequest: null, // this refresh's GET /metrics (parsed), shared by its readers
    // GET /v1/notifications' answer: name -> view, for the names it was read for ("\n"-joined)
    notifications: {details: new Map(), names: null, readAtMs: null, error: null, reload: false},
    events: [],
    eventsCursor: null,
    // GET /v1/activity's samples, oldest first, for the last kept_ms of the node's ring.
    activity: {node: null, startedMs: null, sampleMs: 5000, keptMs: 900000, samples: []},
  };

  // -- small helpers -------------------------------------------------------------------------

  const $ = (selector) => document.querySelector(selector);

  /** Build an element: h("td", {class: "num", title: "x"}, "text", child, ...). */
  function h(tag, props, ...children) {
    const element = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") element.className = value;
      else if (name === "dataset") Object.assign(element.dataset, value);
      else if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
      else element.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      element.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return element;
  }

  function badge(text, kind) {
    return h("span", {class: `badge ${kind || text}`}, text);
  }

  function nowMs() {
    return Date.now() + state.clockOffsetMs;
  }

  function pad(number) {
    return String(number).padStart(2, "0");
  }

  /** "14:03:07" today, "Nov 30 14:03:07" another day, in this browser's time zone. */
  function clock(ms) {
    if (ms === null || ms === undefined) return "—";
    const date = new Date(ms);
    const time = `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
    if (date.toDateString() === new Date(nowMs()).toDateString()) return time;
    return `${date.toLocaleDateString(undefined, {month: "short", day: "numeric"})} ${time}`;
  }

  /** "4 s", "3 min", "2 h", "5 d": whole seconds, rounded to the unit shown. */
  function duration(seconds) {
    if (seconds < 90) return `${seconds} s`;
    if (seconds < 90 * 60) return `${Math.round(seconds / 60)} min`;
    if (seconds < 36 * 3600) return `${Math.round(seconds / 3600)} h`;
    return `${Math.round(seconds / 86400)} d`;
  }

  /** "in 4 s", "12 s ago", "3 min ago", "2 h ago", "5 d ago". */
  function relative(ms) {
    if (ms === null || ms === undefined) return "";
    const delta = ms - nowMs();
    const seconds = Math.round(Math.abs(delta) / 1000);
    if (seconds < 1) return "now";
    const text = duration(seconds);
    return delta > 0 ? `in ${text}` : `${text} ago`;
  }

  /** A time cell: the clock time, with a relative time that ticks (see tickRelativeTimes). */
  function when(ms, {showRelative = true} = {}) {
    if (ms === null || ms === undefined) return h("span", {class: "muted"}, "—");
    const iso = new Date(ms).toISOString();
    return h(
      "time",
      {datetime: iso, title: iso},
      clock(ms),
      showRelative ? h("span", {class: "muted rel", dataset: {ms: String(ms)}}, "") : null,
    );
  }

  function tickRelativeTimes() {
    for (const element of document.querySelectorAll(".rel[data-ms]")) {
      element.textContent = ` (${relative(Number(element.dataset.ms))})`;
    }
  }

  function firstLine(text, chars = 140) {
    if (!text) return "";
    const line = String(text).split("\n").find((part) => part.trim()) || "";
    return line.length > chars ? `${line.slice(0, chars)}…` : line;
  }

  function formatRate(value) {
    if (value === null || value === undefined) return "—";
    if (value === 0) return "0";
    return value >= 10 ? value.toFixed(0) : value.toFixed(1);
  }

  function randomId() {
    // crypto.randomUUID needs a secure context; getRandomValues works on plain http too.
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    return "ui-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  /**
   * Replace a table body's rows, keeping every row and cell whose content did not change, so
   * a button under the pointer is not swapped away by a refresh: a schedule firing every
   * second changes its row each time, and a click that began on the old button and ended on
   * its replacement was lost. `build(item)` returns a <tr>; what a cell's handlers act on must
   * show in its HTML (a name, a label, a title), since an unchanged cell keeps its handlers.
   */
  function renderRows(tbody, items, key, build, emptyText, columns) {
    if (!items.length) {
      tbody.replaceChildren(h("tr", {}, h("td", {class: "empty", colspan: columns}, emptyText)));
      return;
    }
    const old = new Map();
    for (const row of tbody.rows) if (row.dataset.key) old.set(row.dataset.key, row);
    const rows = items.map((item) => {
      const rowKey = String(key(item));
      const signature = JSON.stringify(item);
      const existing = old.get(rowKey);
      if (existing && existing.dataset.signature === signature) return existing;
      const row = build(item);
      row.dataset.key = rowKey;
      row.dataset.signature = signature;
      return existing ? updateRow(existing, row) : row;
    });
    placeChildren(tbody, rows);
  }

  /**
   * `parent`'s children made `nodes`, in order, moving only what is out of place. A node taken
   * out of the page, even to be put back at once, cancels a click pressed on it (the browser
   * fires no click when the pressed element left the document before the release), and a
   * person's click lasts long enough for a refresh to land in between.
   */
  function placeChildren(parent, nodes) {
    // What leaves goes first: then the children that stay are already in their places, and
    // one replaced or removed above them does not move them (which would take them out).
    const staying = new Set(nodes);
    for (const child of [...parent.childNodes]) if (!staying.has(child)) child.remove();
    nodes.forEach((node, index) => {
      const here = parent.childNodes[index];
      if (here !== node) parent.insertBefore(node, here || null);
    });
  }

  /**
   * `parent`'s children made like `fresh`: each child equal to the fresh one at its place
   * stays (and keeps its handlers), the others are replaced; see placeChildren.
   */
  function morphChildren(parent, fresh) {
    const old = [...parent.childNodes];
    placeChildren(parent, fresh.map((node, index) => (old[index] && old[index].isEqualNode(node) ? old[index] : node)));
  }

  /** `old` made like `fresh`: its attributes, and each cell that differs, replaced. */
  function updateRow(old, fresh) {
    for (const name of old.getAttributeNames()) if (!fresh.hasAttribute(name)) old.removeAttribute(name);
    for (const name of fresh.getAttributeNames()) old.setAttribute(name, fresh.getAttribute(name));
    morphChildren(old, [...fresh.cells]);
    return old;
  }

  // -- errors and notices --------------------------------------------------------------------

  function setError(source, message) {
    if (message) state.errors.set(source, message);
    else state.errors.delete(source);
  }

  function renderErrors() {
    const box = $("#errors");
    const lines = [];
    for (const [source, message] of state.errors) {
      lines.push(h("div", {class: "error", dataset: {source}}, h("strong", {}, source), ": ", message));
    }
    if (state.errors.has("this node") && state.cluster) {
      // This node does not answer: point at the others, which serve the same dashboard.
      const others = state.cluster.members.filter((member) => !member.self);
      if (others.length) {
        lines.push(
          h(
            "div",
            {class: "error"},
            "Other members serve this dashboard too: ",
            others.map((member, index) => [
              index ? ", " : "",
              h("a", {href: memberUrl(member.http_address) + "/"}, member.node_id),
            ]),
          ),
        );
      }
    }
    box.replaceChildren(...lines);
  }

  let noticeTimer = null;
  function notice(text) {
    const box = $("#notice");
    box.textContent = text;
    box.hidden = false;
    clearTimeout(noticeTimer);
    noticeTimer = setTimeout(() => (box.hidden = true), 6000);
  }

  // -- the API -------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, code, message, field) {
      super(message);
      this.status = status;
      this.code = code;
      this.field = field;
    }

    describe() {
      const where = this.field ? ` (${this.field})` : "";
      return this.status ? `${this.status} ${this.code}${where}: ${this.message}` : this.message;
    }
  }

  /**
   * One request to this node (or to `base`, another member). Returns parsed JSON, or text for
   * a text answer. Throws ApiError: status 0 when the node could not be reached at all.
   */
  async function api(method, path, {body, base = "", timeoutMs = REQUEST_TIMEOUT_MS, requestId} = {}) {
    const headers = {Accept: "application/json"};
    const sentToken = state.token;
    if (sentToken) headers.Authorization = `Bearer ${sentToken}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (requestId) headers["X-Request-Id"] = requestId;
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), timeoutMs);
    let response;
    try {
      response = await fetch(base + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: controller.signal,
        cache: "no-store",
        credentials: "omit",
      });
    } catch (error) {
      const host = base ? base.replace(/^https?:\/\//, "") : location.host;
      const why = error.name === "AbortError" ? `no answer within ${timeoutMs / 1000} s` : error.message;
      throw new ApiError(0, "unreachable", `cannot reach ${host}: ${why}`);
    } finally {
      clearTimeout(timer);
    }
    const type = response.headers.get("Content-Type") || "";
    const raw = await response.text();
    let parsed = raw;
    if (type.includes("json")) {
      try {
        parsed = JSON.parse(raw);
      } catch {
        parsed = raw;
      }
    }
    if (response.ok) return parsed;
    const detail = parsed && parsed.error ? parsed.error : {};
    const error = new ApiError(
      response.status,
      detail.code || `http_${response.status}`,
      detail.message || (typeof parsed === "string" && parsed.slice(0, 200)) || response.statusText,
      detail.field,
    );
    error.retryAfterS = Number(response.headers.get("Retry-After")) || 1;
    // A 401 speaks of the token this request carried: one sent before a token was given (a
    // refresh asks several things at once) must not reopen the dialog or drop the new token.
    if (response.status === 401 && !base && sentToken === state.token) askForToken(error);
    throw error;
  }

  /** A write through Raft: one request_id for every try, retried while the answer is 503. */
  async function write(path, body = {}) {
    const requestId = randomId();
    for (let attempt = 1; ; attempt++) {
      try {
        return await api("POST", path, {body: {...body, request_id: requestId}});
      } catch (error) {
        const retryable = error.status === 503 || error.status === 0;
        if (!retryable || attempt >= WRITE_TRIES) throw error;
        await new Promise((resolve) => setTimeout(resolve, 1000 * Math.min(error.retryAfterS || 1, 5)));
      }
    }
  }

  /** Run a button's action: the button waits, the outcome shows as a notice or an error. */
  async function act(button, what, action) {
    button.disabled = true;
    try {
      const message = await action();
      setError("action", null);
      notice(message || `${what}: done`);
    } catch (error) {
      const hint = error.status === 403 ? " (use “change token” for a token with that grant)" : "";
      setError("action", `${what} failed: ${error.describe ? error.describe() : error}${hint}`);
    } finally {
      button.disabled = false;
      renderErrors();
      refreshSoon();
    }
  }

  // -- the token -----------------------------------------------------------------------------

  /** A 401: ask for a token with the dialog (once: later 401s wait for the same answer). */
  function askForToken(error) {
    state.tokenSeen = true;
    $("#token-button").hidden = false;
    if (state.tokenNeeded) return;
    state.tokenNeeded = true;
    const refused = Boolean(state.token);
    if (refused) {
      sessionStorage.removeItem(TOKEN_KEY);
      state.token = null;
    }
    openTokenDialog(refused ? `The token was refused: ${error.message}` : null);
  }

  function openTokenDialog(message) {
    const dialog = $("#token-dialog");
    const text = $("#token-error");
    text.textContent = message || "";
    text.hidden = !message;
    $("#token-input").value = "";
    if (!dialog.open) dialog.showModal();
    $("#token-input").focus();
  }

  function useToken(token) {
    state.token = token;
    sessionStorage.setItem(TOKEN_KEY, token);
    state.tokenNeeded = false;
    state.tokenSeen = true;
    state.notifications.reload = true; // its grants may differ: read the receivers again
    setError("token", null);
    $("#token-button").textContent = "change token";
    $("#token-dialog").close();
    refreshSoon();
  }

  // -- loading -------------------------------------------------------------------------------

  async function loadCluster() {
    const view = await api("GET", "/v1/cluster?members=1");
    state.cluster = view;
    if (view.state && view.state.now_ms && view.leader) {
      const offset = view.state.now_ms - Date.now();
      state.clockOffsetMs = Math.abs(offset) > 5000 ? offset : 0;
    }
    renderHeader();
    renderMembers();
    probeMembers(); // in the background: re-renders the members when the answers come
  }

  function memberUrl(httpAddress) {
    // A node bound to every interface names 0.0.0.0 or [::]; reach it by this page's host name.
    const [host, port] = splitAddress(httpAddress);
    const usable = host === "0.0.0.0" || host === "::" || host === "[::]" ? location.hostname : host;
    return `${location.protocol}//${usable.includes(":") && !usable.startsWith("[") ? `[${usable}]` : usable}:${port}`;
  }

  function splitAddress(address) {
    const at = address.lastIndexOf(":");
    return [address.slice(0, at), address.slice(at + 1)];
  }

  /** Ask every other member for its own /v1/cluster (applied index, role, term), if we may. */
  function probeMembers() {
    if (!state.cluster) return;
    const due = state.cluster.members.filter((member) => {
      if (member.self) return false;
      const last = state.probes.get(member.node_id);
      return !last || !last.error || Date.now() - last.atMs > MEMBER_RETRY_MS;
    });
    for (const member of due) {
      api("GET", "/v1/cluster", {base: memberUrl(member.http_address), timeoutMs: MEMBER_TIMEOUT_MS})
        .then((view) => state.probes.set(member.node_id, {atMs: Date.now(), view}))
        .catch((error) => state.probes.set(member.node_id, {atMs: Date.now(), error: error.describe()}))
        .finally(renderMembers);
    }
  }

  async function loadSchedules() {
    const answer = await api("GET", "/v1/schedules");
    renderSchedules(answer.schedules);
  }

  function jobsQuery(filters, cursor, limit) {
    const query = new URLSearchParams({limit: String(limit)});
    for (const [name, value] of Object.entries(filters)) {
      if (name === "payload") for (const [path, raw] of value) query.append(`payload.${path}`, raw);
      else if (value !== "" && value !== null && value !== undefined) query.set(name, String(value));
    }
    if (cursor) query.set("cursor", String(cursor));
    return `/v1/jobs?${query}`;
  }

  async function loadJobs() {
    const jobs = state.jobs;
    let answer;
    try {
      answer = await api("GET", jobsQuery(jobs.filters, jobs.cursors[jobs.page], JOBS_PAGE));
    } catch (error) {
      if (error.status === 400) {
        // The search itself is refused (the error names the field): no stale rows under it.
        jobs.next = null;
        renderJobs([], "this search is refused (the error above says why)");
      }
      throw error;
    }
    jobs.next = answer.next_cursor;
    renderJobs(answer.jobs);
  }

  async function loadDeadLetter() {
    const answer = await api("GET", jobsQuery({status: "failed"}, null, 50));
    renderDeadLetter(answer.jobs, answer.next_cursor);
  }

  /** This refresh's GET /metrics, parsed: asked once, whoever reads it first. */
  function metricsOnce() {
    if (!state.metricsRequest) {
      state.metricsRequest = api("GET", "/metrics").then((text) => parseMetrics(typeof text === "string" ? text : ""));
    }
    return state.metricsRequest;
  }

  async function loadQueues() {
    // Limits, live counts and held-back jobs from /v1/queues; the job counters (for the rates)
    // from /metrics.
    const [metrics, answer] = await Promise.all([metricsOnce(), api("GET", "/v1/queues")]);
    const counters = new Map();
    for (const counter of COUNTERS) {
      for (const sample of metrics.get(`raftcron_jobs_${counter}_total`) || []) {
        counters.set(`${counter}|${sample.labels.queue}`, sample.value);
      }
    }
    const atMs = Date.now();
    state.counterSamples.push({atMs, counters});
    // Keep one sample older than the window, so a rate always spans about RATE_WINDOW_MS.
    while (state.counterSamples.length > 2 && atMs - state.counterSamples[1].atMs >= RATE_WINDOW_MS) {
      state.counterSamples.shift();
    }
    renderQueues(new Map(answer.queues.map((queue) => [queue.name, queue])), counters);
  }

  async function loadUsage() {
    renderUsage(await api("GET", "/v1/settings"));
  }

  async function loadActivity() {
    const activity = state.activity;
    const newest = activity.samples[activity.samples.length - 1];
    let answer = await api("GET", `/v1/activity?since_ms=${newest ? newest.at_ms : 0}`);
    if (answer.started_ms !== activity.startedMs) {
      // Another ring (the node restarted): what was drawn is not its history.
      activity.samples = [];
      activity.startedMs = answer.started_ms;
      if (newest) answer = await api("GET", "/v1/activity");
    }
    activity.node = answer.node;
    activity.sampleMs = answer.sample_ms;
    activity.keptMs = answer.kept_ms;
    activity.samples.push(...answer.samples);
    const last = activity.samples[activity.samples.length - 1];
    if (last) activity.samples = activity.samples.filter((s) => s.at_ms > last.at_ms - activity.keptMs);
    renderActivity();
  }

  /** Prometheus text format -> Map(name -> [{labels, value}]). Comments and blanks skipped. */
  function parseMetrics(text) {
    const out = new Map();
    const line = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
    const label = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
    for (const row of text.split("\n")) {
      if (!row || row.startsWith("#")) continue;
      const match = line.exec(row);
      if (!match) continue;
      const labels = {};
      for (const [, name, value] of (match[2] || "").matchAll(label)) {
        labels[name] = value.replace(/\\n/g, "\n").replace(/\\(.)/g, "$1");
      }
      if (!out.has(match[1])) out.set(match[1], []);
      out.get(match[1]).push({labels, value: Number(match[3])});
    }
    return out;
  }

  /** A counter's rate per second over the samples kept, or null before there are two. */
  function rate(key) {
    const samples = state.counterSamples;
    if (samples.length < 2) return null;
    const first = samples[0];
    const last = samples[samples.length - 1];
    const seconds = (last.atMs - first.atMs) / 1000;
    const delta = (last.counters.get(key) || 0) - (first.counters.get(key) || 0);
    return seconds > 0 && delta >= 0 ? delta / seconds : null;
  }

  /**
   * The notifications /metrics names, with its delivery figures; the receivers' URLs and
   * events from GET /v1/notifications, read again only when those names changed (or on
   * "reload"): see the header for why. A 403 (a token without the manage grant) is said in
   * the panel, once, not retried until the names change.
   */
  async function loadNotifications() {
    const live = notificationFigures(await metricsOnce());
    const notes = state.notifications;
    const names = [...live.keys()].sort().join("\n");
    if (!names) {
      Object.assign(notes, {details: new Map(), names, error: null, reload: false});
    } else if (names !== notes.names || notes.reload) {
      notes.reload = false;
      try {
        const answer = await api("GET", "/v1/notifications");
        notes.details = new Map(answer.notifications.map((item) => [item.name, item]));
        Object.assign(notes, {names, readAtMs: Date.now(), error: null});
      } catch (error) {
        if (error.status === 403) Object.assign(notes, {names, error: `${error.describe()} (a token with the manage grant reads them)`});
        else if (error.status !== 401) notes.error = error.describe ? error.describe() : String(error);
      }
    }
    renderNotifications([...live.values()]);
  }

  /** /metrics' notification lines -> Map(name -> figures); this node's POSTs by outcome. */
  function notificationFigures(metrics) {
    const live = new Map();
    for (const sample of metrics.get("raftcron_notification_pending") || []) {
      const name = sample.labels.notification;
      live.set(name, {name, pending: sample.value, lagS: 0, delivered: 0, lost: 0, postsOk: 0, postsFailed: 0});
    }
    const fields = {
      raftcron_notification_lag_seconds: "lagS",
      raftcron_notification_delivered_total: "delivered",
      raftcron_notification_lost_total: "lost",
    };
    for (const [metric, field] of Object.entries(fields)) {
      for (const sample of metrics.get(metric) || []) {
        const figures = live.get(sample.labels.notification);
        if (figures) figures[field] = sample.value;
      }
    }
    for (const sample of metrics.get("raftcron_notification_posts_total") || []) {
      const figures = live.get(sample.labels.notification);
      if (figures) figures[sample.labels.outcome === "ok" ? "postsOk" : "postsFailed"] += sample.value;
    }
    return live;
  }

  async function loadEvents() {
    if (state.eventsCursor === null) {
      // A cursor past the end answers with the newest sequence number: start a page before it.
      const probe = await api("GET", "/v1/events?cursor=4611686018427387904&limit=1");
      state.eventsCursor = Math.max(0, probe.next_cursor - 50);
    }
    for (let page = 0; page < 5; page++) {
      const answer = await api("GET", `/v1/events?cursor=${state.eventsCursor}&limit=500`);
      if (answer.next_cursor < state.eventsCursor) {
        // The cluster's event log is younger than our cursor (a fresh cluster at this address).
        state.events = [];
      }
      state.events.push(...answer.events);
      state.eventsCursor = answer.next_cursor;
      if (answer.events.length < 500) break;
    }
    state.events = state.events.slice(-EVENTS_KEPT);
    renderEvents();
  }

  async function loadJobDetail() {
    if (state.selectedJobId === null) return;
    const id = state.selectedJobId;
    let job;
    try {
      job = await api("GET", `/v1/jobs/${id}`);
    } catch (error) {
      if (error.status === 404 && state.selectedJobId === id) {
        renderJobDetail(null, `no job ${id} on this node: never submitted, or past the archive's retention`);
        return;
      }
      throw error;
    }
    const [schedule, workflow] = await Promise.all([scheduleOf(job), workflowOf(job)]);
    if (state.selectedJobId === id) renderJobDetail(job, null, {schedule, workflow});
  }

  /** The schedule that fired `job`: {view}, {gone: true} once deleted, or {error}. */
  async function scheduleOf(job) {
    if (!job.schedule) return null;
    try {
      return {view: await api("GET", `/v1/schedules/${encodeURIComponent(job.schedule)}`)};
    } catch (error) {
      if (error.status === 404) return {gone: true};
      return {error: error.describe ? error.describe() : String(error)};
    }
  }

  /**
   * The jobs of `job`'s workflow: {jobs} or {error}. There is no route for a workflow; its
   * jobs were created by one command, so at one created_ms and with consecutive ids: a search
   * of that instant over the ids around the job's, keeping those of its workflow, finds them
   * (live or archived) in a few requests.
   */
  async function workflowOf(job) {
    if (job.workflow_id === null || job.workflow_id === undefined) return null;
    const instant = {created_from_ms: job.created_ms, created_to_ms: job.created_ms};
    const lowest = job.id - WORKFLOW_JOBS_MAX + 1;
    const found = [];
    let cursor = job.id + WORKFLOW_JOBS_MAX;
    try {
      for (let page = 0; page < WORKFLOW_PAGES_MAX && cursor && cursor > lowest; page++) {
        const answer = await api("GET", jobsQuery(instant, cursor, PAGE_MAX));
        found.push(...answer.jobs.filter((other) => other.workflow_id === job.workflow_id));
        cursor = answer.next_cursor;
      }
    } catch (error) {
      return {error: error.describe ? error.describe() : String(error)};
    }
    return {jobs: found, partial: Boolean(cursor && cursor > lowest)};
  }

  // -- rendering: header and members ---------------------------------------------------------

  function renderHeader() {
    const view = state.cluster;
    $("#this-node").textContent = `${view.node} (${location.host})`;
    const leader = $("#leader-node");
    leader.textContent = view.leader || "none (no leader now)";
    leader.className = view.leader ? "" : "bad";
    $("#term").textContent = view.term;
    $("#applied").textContent = `${view.applied_index} / commit ${view.commit_index}`;
    document.title = `raftcron · ${view.node}${view.role === "leader" ? " (leader)" : ""}`;
  }

  /** A member's clock offset; this node's own cell says how far it is off from the majority
   * (a skewed node never ticks its own clock: DESIGN.md §8.2). */
  function clockCell(row, clock) {
    if (row.self) {
      if (!clock || clock.skew_ms === null) return badge("?", "unknown");
      const text = `${clock.skew_ms >= 0 ? "+" : ""}${clock.skew_ms} ms vs majority`;
      return clock.skewed ? badge(`skewed ${text}`, "no") : text;
    }
    if (row.clockOffsetMs === null) return "?";
    return `${row.clockOffsetMs >= 0 ? "+" : ""}${row.clockOffsetMs} ms`;
  }

  function renderMembers() {
    const view = state.cluster;
    if (!view) return;
    // The leader's commit index: its own answer if we have it, else this node's (a follower's
    // commit index trails the leader's by about one heartbeat).
    const leaderProbe = view.leader ? state.probes.get(view.leader) : null;
    let leaderCommit = view.commit_index;
    if (view.role !== "leader" && leaderProbe && leaderProbe.view) leaderCommit = leaderProbe.view.commit_index;
    let fallback = false;
    const rows = view.members.map((member) => {
      const probe = state.probes.get(member.node_id);
      // Best source first: the member's own answer; then figures this node gathered for it
      // (/v1/cluster?members=1 asks every member server-side: role, term, applied_index);
      // then the leader's match index; else unknown.
      let own = member.self ? view : probe && probe.view ? probe.view : null;
      if (!own && typeof member.applied_index === "number" && member.role) own = member;
      let applied = null;
      let appliedNote = null;
      if (own) applied = own.applied_index;
      else if (typeof member.applied_index === "number") applied = member.applied_index;
      else if (typeof member.match_index === "number") {
        applied = member.match_index;
        appliedNote = "replicated up to here (the leader's match index): the browser could not ask this member";
      }
      if (!own) fallback = true;
      const role = own ? own.role : member.node_id === view.leader ? "leader" : view.leader ? "follower" : "?";
      return {
        node_id: member.node_id,
        self: member.self,
        role,
        roleGuessed: !own,
        term: own && typeof own.term === "number" ? own.term : null,
        applied,
        appliedNote,
        lag: applied === null ? null : Math.max(0, leaderCommit - applied),
        reachable: member.reachable,
        clockOffsetMs: typeof member.clock_offset_ms === "number" ? member.clock_offset_ms : null,
        http_address: member.http_address,
        probeError: probe && probe.error ? probe.error : null,
        membership: member.state || "voter",
      };
    });
    renderRows(
      $("#members tbody"),
      rows,
      (row) => row.node_id,
      (row) =>
        h(
          "tr",
          {dataset: {node: row.node_id, role: row.role}},
          h(
            "td",
            {},
            h("strong", {}, row.node_id),
            row.self ? h("span", {class: "self-mark"}, "this page") : null,
            // A node being added counts toward nothing until it caught up; one being removed
            // stands for no election (DESIGN.md §8.4).
            row.membership !== "voter" ? badge(row.membership.replace("_", " "), "unknown") : null,
          ),
          h(
            "td",
            {title: row.roleGuessed ? "as the node this page talks to sees it" : null},
            badge(row.role, row.role === "?" ? "unknown" : row.role),
          ),
          h("td", {class: "num"}, row.term === null ? "?" : row.term),
          h("td", {class: "num", title: row.appliedNote}, row.applied === null ? "?" : `${row.appliedNote ? "~" : ""}${row.applied}`),
          h("td", {class: "num"}, row.lag === null ? "?" : row.lag),
          h(
            "td",
            {title: row.probeError ? `browser: ${row.probeError}` : null},
            row.self ? badge("self", "yes") : row.reachable === true ? badge("yes") : row.reachable === false ? badge("no") : badge("?", "unknown"),
          ),
          h("td", {class: "num"}, clockCell(row, view.clock)),
          h("td", {class: "mono"}, h("a", {href: `${memberUrl(row.http_address)}/`, title: "this member's dashboard"}, row.http_address)),
        ),
      "no members",
      8,
    );
    const leaders = rows.filter((row) => row.role === "leader").length;
    $("#members-note").textContent = `${rows.length} nodes, ${leaders === 1 ? "1 leader" : leaders ? `${leaders} leaders?` : "no leader"}`;
    const change = view.membership_change;
    $("#members-change").textContent = change
      ? `Membership change ${change.change_id} in progress: ${change.action} ${change.member.node_id} ` +
        `(${change.phase.replace("_", " ")}${change.cancel_reason ? `, cancelled: ${change.cancel_reason}` : ""}).`
      : "";
    $("#members-hint").textContent = fallback
      ? "Rows marked ? or ~ could not be asked from this browser (a member's API is another origin, " +
        "and the browser needs CORS headers to read it): their figures come from this node, or are unknown."
      : "";
  }

  // -- rendering: the state against its budget -----------------------------------------------

  function mib(bytes) {
    return `${(bytes / MiB).toFixed(1)} MiB`;
  }

  /** `used` as a share of `budget`, rounded down (99.7% is "99%", never a "100%" that is not
   * full), with one decimal under 10%. */
  function percentText(used, budget) {
    const exact = (100 * used) / budget;
    return exact < 10 ? `${(Math.floor(exact * 10) / 10).toFixed(1)}%` : `${Math.floor(exact)}%`;
  }

  function renderUsage(view) {
    const usage = view.usage;
    const used = usage.state_bytes;
    const budget = usage.budget_bytes;
    const gauge = $("#budget-gauge");
    const percent = $("#budget-percent");
    const finalized = view.finalized && typeof budget === "number" && budget > 0;
    const pending = usage.retention_pending ? ", evicting…" : "";
    $("#state-note").textContent = `(cluster level ${view.level}${finalized ? "" : ", not finalized"}${pending})`;
    if (!finalized) {
      gauge.hidden = true;
      percent.textContent = "";
      percent.className = "budget-percent";
      $("#budget-figures").replaceChildren(
        h("strong", {dataset: {testid: "not-finalized"}}, "not finalized: no budget (previous release's behaviour)"),
        ` · the state holds ${mib(used)}`,
      );
      $("#state-hint").textContent =
        "Retention is the previous release's (7 days) and nothing is refused for space until the cluster is " +
        "finalized: raftcron cluster finalize, once every member runs this release.";
    } else {
      // The same integer test as the doctor's: a share at the warning line is a warning.
      const level = used >= budget ? "full" : 100 * used >= BUDGET_WARN_PCT * budget ? "warn" : "ok";
      const exact = (100 * used) / budget;
      gauge.hidden = false;
      gauge.dataset.level = level;
      gauge.setAttribute("aria-valuenow", String(Math.min(100, exact)));
      gauge.title = `${used} of ${budget} bytes`;
      $("#budget-fill").style.width = `${Math.min(100, exact)}%`; // CSSOM: allowed by the page's CSP
      percent.textContent = percentText(used, budget);
      percent.className = `budget-percent ${level}`;
      const said = {
        ok: null,
        warn: ` · ${BUDGET_WARN_PCT}% or more: new jobs are refused once they no longer fit; finish or cancel work, lower retention, or raise the budget`,
        full: " · full: new jobs are refused (507 state_full) while nothing finished is left to evict",
      }[level];
      // replaceChildren writes a null as the text "null": only the parts there are.
      $("#budget-figures").replaceChildren(`${mib(used)} of a ${mib(budget)} budget`, ...(said ? [h("span", {class: level}, said)] : []));
      $("#state-hint").textContent =
        "Bytes of the state's memory model, which the budget bounds (GET /v1/settings). Change the budget with " +
        "raftcron settings budget SIZE, retention with raftcron settings retention.";
    }
    if (usage.fires_refused) {
      $("#budget-figures").append(h("span", {class: "warn"}, ` · ${usage.fires_refused} schedule fire(s) refused for space`));
    }
    renderUsageTables(usage);
  }

  function renderUsageTables(usage) {
    const kept = ["succeeded", "failed", "cancelled"].map((outcome) => ({outcome, count: usage.kept[outcome] || 0}));
    renderRows(
      $("#kept tbody"),
      kept,
      (row) => row.outcome,
      (row) => h("tr", {dataset: {outcome: row.outcome}}, h("td", {}, badge(row.outcome)), h("td", {class: "num"}, row.count)),
      "none",
      2,
    );
    const evicted = Object.entries(usage.evicted || {}).map(([reason, count]) => ({reason, count}));
    renderRows(
      $("#evicted tbody"),
      evicted,
      (row) => row.reason,
      (row) =>
        h(
          "tr",
          {dataset: {reason: row.reason}},
          h("td", {title: EVICTION_REASONS[row.reason] || null}, row.reason),
          h("td", {class: "num"}, row.count),
        ),
      "none yet",
      2,
    );
    const queues = Object.entries(usage.bytes_by_queue || {})
      .sort(([nameA, a], [nameB, b]) => b - a || (nameA < nameB ? -1 : 1))
      .slice(0, STATE_QUEUES_SHOWN)
      .map(([queue, bytes]) => ({queue, bytes}));
    renderRows(
      $("#state-queues tbody"),
      queues,
      (row) => row.queue,
      (row) =>
        h(
          "tr",
          {dataset: {queue: row.queue}},
          h("td", {}, h("a", {href: "#jobs-panel", onclick: () => filterJobs({queue: row.queue})}, row.queue)),
          h("td", {class: "num", title: `${row.bytes} bytes`}, (row.bytes / MiB).toFixed(1)),
        ),
      "no jobs",
      2,
    );
  }

  // -- rendering: queues ---------------------------------------------------------------------

  const HELD_NAMES = {paused: "paused", queue_concurrency: "cap", queue_rate: "rate", key_concurrency: "key", key_rate: "key rate"};

  function describeLimits(queue) {
    const parts = [];
    if (queue.concurrency_max !== null) parts.push(`≤ ${queue.concurrency_max} running`);
    if (queue.rate_limit) {
      const rate = queue.rate_limit;
      const rule = rate.burst ? `bucket of ${rate.burst}` : queue.rate_rule === "bucket" ? "bucket" : "window";
      parts.push(`${rate.max} per ${rate.per_ms % 1000 ? `${rate.per_ms} ms` : `${rate.per_ms / 1000} s`}, ${rule} (${queue.tokens} left)`);
    }
    return parts.length ? parts.join(" · ") : h("span", {class: "muted"}, "none");
  }

  function renderQueues(queues, counters) {
    const names = new Set(queues.keys());
    for (const key of counters.keys()) names.add(key.split("|").slice(1).join("|"));
    const rows = [...names].sort().map((name) => ({
      queue: queues.get(name) || {name, paused: false, concurrency_max: null, rate_limit: null, tokens: null, queued: 0, running: 0, held: {}},
      rates: ["submitted", "succeeded", "failed", "retried"].map((counter) => formatRate(rate(`${counter}|${name}`))),
      totals: ["submitted", "succeeded", "failed", "retried"].map((counter) => counters.get(`${counter}|${name}`) || 0),
    }));
    renderRows(
      $("#queues tbody"),
      rows,
      (row) => row.queue.name,
      (row) => {
        const queue = row.queue;
        const held = Object.entries(queue.held).filter(([, count]) => count > 0);
        const verb = queue.paused ? "resume" : "pause";
        return h(
          "tr",
          {dataset: {queue: queue.name, paused: String(queue.paused)}},
          h("td", {}, h("a", {href: "#jobs-panel", onclick: () => filterJobs({queue: queue.name})}, queue.name)),
          h("td", {}, queue.paused ? badge("paused") : badge("active")),
          h("td", {class: "num"}, queue.queued),
          h("td", {class: "num"}, queue.running),
          h("td", {class: "limits"}, describeLimits(queue)),
          h(
            "td",
            {dataset: {testid: "held"}},
            held.length
              ? h("div", {class: "held"}, held.map(([reason, count]) => h("span", {class: "badge paused", title: reason}, `${HELD_NAMES[reason] || reason} ${count}`)))
              : h("span", {class: "muted"}, "—"),
          ),
          // The counter's total since the cluster began shows on hover.
          row.rates.map((value, index) => h("td", {class: "num", title: `${row.totals[index]} in total`}, value)),
          h(
            "td",
            {class: "actions"},
            h("button", {type: "button", class: queue.paused ? null : "quiet", onclick: (event) => act(event.currentTarget, `${verb} queue ${queue.name}`, () => controlQueue(queue.name, verb))}, verb),
          ),
        );
      },
      "no queue has seen a job yet",
      11,
    );
  }

  async function controlQueue(name, verb) {
    await write(`/v1/queues/${encodeURIComponent(name)}/${verb}`);
    return `queue ${name} ${verb === "pause" ? "paused" : "resumed"}`;
  }

  // -- rendering: notifications --------------------------------------------------------------

  /** A receiver's URL without its query, which may carry the receiver's own token. */
  function receiverUrl(url) {
    const at = url.indexOf("?");
    return at < 0 ? url : `${url.slice(0, at)}?…`;
  }

  function renderNotifications(figures) {
    const notes = state.notifications;
    const rows = figures.map((live) => {
      const detail = notes.details.get(live.name);
      return {
        ...live,
        lagS: Math.round(live.lagS), // the oldest pending event's age, in whole seconds
        url: detail ? receiverUrl(detail.url) : null,
        events: detail ? detail.events : null,
      };
    });
    const unread = notes.error || "not read yet";
    renderRows(
      $("#notifications tbody"),
      rows,
      (row) => row.name,
      (row) =>
        h(
          "tr",
          {dataset: {notification: row.name}},
          h("td", {}, h("strong", {}, row.name)),
          h("td", {class: "mono wrap", dataset: {testid: "receiver"}}, row.url === null ? h("span", {class: "muted", title: unread}, "?") : row.url),
          h(
            "td",
            {dataset: {testid: "events"}},
            row.events === null
              ? h("span", {class: "muted", title: unread}, "?")
              : h("div", {class: "held"}, row.events.map((kind) => badge(kind, "unknown"))),
          ),
          h("td", {class: "num", dataset: {testid: "pending"}}, row.pending),
          h("td", {}, row.pending ? duration(row.lagS) : h("span", {class: "muted"}, "—")),
          h("td", {class: "num"}, row.delivered),
          h("td", {class: "num"}, row.lost ? badge(String(row.lost), "failed") : "0"),
          h("td", {class: "num"}, `${row.postsOk} / ${row.postsFailed}`),
        ),
      "no notification: PUT /v1/notifications/{name} or raftcron notifications put",
      8,
    );
    const read = notes.readAtMs ? `, read ${clock(notes.readAtMs)}` : "";
    $("#notifications-hint").textContent = notes.error
      ? `Receivers and events not read: ${notes.error}.`
      : rows.length
        ? `Receivers and events as GET /v1/notifications answered${read}: read again when a notification ` +
          "comes or goes, or on reload (each read is an admin action in the audit trail). The figures follow every refresh."
        : "";
  }

  // -- rendering: schedules ------------------------------------------------------------------

  function describeSpec(spec) {
    const kind = ["cron", "every", "at"].find((name) => spec[name] !== undefined);
    const text = kind ? `${kind} ${spec[kind]}` : "?";
    return spec.tz && spec.tz !== "UTC" ? `${text} (${spec.tz})` : text;
  }

  function renderSchedules(schedules) {
    renderRows(
      $("#schedules tbody"),
      schedules,
      (schedule) => schedule.name,
      (schedule) => {
        const spec = schedule.spec || {};
        const skipped = schedule.overlap_skipped + schedule.misfire_skipped;
        const recent = (schedule.recent_fires || []).slice(0, 6);
        const pauseButton = schedule.paused
          ? h("button", {type: "button", onclick: (event) => act(event.currentTarget, `resume ${schedule.name}`, () => control(schedule.name, "resume"))}, "resume")
          : h("button", {type: "button", class: "quiet", onclick: (event) => act(event.currentTarget, `pause ${schedule.name}`, () => control(schedule.name, "pause"))}, "pause");
        return h(
          "tr",
          {dataset: {schedule: schedule.name, paused: String(schedule.paused)}},
          h(
            "td",
            {class: "wrap"},
            h("strong", {}, schedule.name),
            spec.description ? h("div", {class: "muted"}, spec.description) : null,
          ),
          h("td", {class: "mono"}, describeSpec(spec)),
          h("td", {}, schedule.paused ? badge("paused") : badge("active")),
          h("td", {title: schedule.next_fire_local || null}, schedule.paused ? h("span", {class: "muted"}, "paused") : when(schedule.next_fire_ms)),
          h(
            "td",
            {},
            recent.length
              ? h(
                  "div",
                  {class: "chips", dataset: {testid: "recent-fires"}},
                  recent.map((fire) =>
                    h(
                      "button",
                      {
                        type: "button",
                        class: "chip",
                        title: fire.job_id ? `fire time ${new Date(fire.fire_time_ms).toISOString()}: job ${fire.job_id}` : "no job",
                        onclick: () => fire.job_id && selectJob(fire.job_id),
                      },
                      clock(fire.fire_time_ms),
                    ),
                  ),
                )
              : h("span", {class: "muted"}, "none yet"),
          ),
          h("td", {class: "num", dataset: {testid: "fires"}}, schedule.fires),
          h(
            "td",
            {class: "num", title: `overlap ${schedule.overlap_skipped}, misfire ${schedule.misfire_skipped}`},
            skipped ? `${schedule.overlap_skipped} / ${schedule.misfire_skipped}` : "0",
          ),
          h("td", {class: "num"}, schedule.misfires, schedule.misfires_truncated ? "+" : ""),
          h(
            "td",
            {class: "actions"},
            pauseButton,
            h("button", {type: "button", class: "quiet", onclick: (event) => act(event.currentTarget, `trigger ${schedule.name}`, () => trigger(schedule.name))}, "trigger"),
            h("a", {href: "#jobs-panel", class: "quiet", onclick: () => filterJobs({schedule: schedule.name})}, "jobs"),
          ),
        );
      },
      "no schedules",
      9,
    );
  }

  async function control(name, verb) {
    await write(`/v1/schedules/${encodeURIComponent(name)}/${verb}`);
    return `${name} ${verb === "pause" ? "paused" : "resumed"}`;
  }

  async function trigger(name) {
    const path = `/v1/schedules/${encodeURIComponent(name)}/trigger`;
    let answer;
    try {
      answer = await write(path);
    } catch (error) {
      if (error.code !== "overlap" || !confirm(`${error.message}\n\nRun it anyway?`)) throw error;
      answer = await write(path, {force: true});
    }
    return answer.job ? `${name} triggered: job ${answer.job.id}` : `${name}: the run is buffered`;
  }

  // -- rendering: jobs, one job, the dead letter ---------------------------------------------

  /** "1/3"; after a manual retry a job may go past max_attempts, then just the count. */
  function attemptsText(job) {
    return job.attempts <= job.max_attempts ? `${job.attempts}/${job.max_attempts}` : String(job.attempts);
  }

  function renderJobs(jobs, emptyText = null) {
    renderRows(
      $("#jobs tbody"),
      jobs,
      (job) => job.id,
      (job) =>
        h(
          "tr",
          {
            dataset: {job: String(job.id), status: job.status, archived: job.archived ? "true" : null},
            class: job.id === state.selectedJobId ? "selected" : null,
            onclick: () => selectJob(job.id),
          },
          h("td", {class: "num"}, job.id),
          h("td", {}, job.task),
          h("td", {}, job.queue),
          h("td", {}, badge(job.status), job.archived ? archivedBadge() : null),
          h("td", {class: "num"}, attemptsText(job)),
          h("td", {}, job.schedule ? [job.schedule, h("span", {class: "muted"}, ` @ ${clock(job.fire_time_ms)}`)] : h("span", {class: "muted"}, "—")),
          h("td", {}, when(job.created_ms)),
          h("td", {}, when(job.finished_ms, {showRelative: false})),
        ),
      emptyText || (hasFilters() ? "no job matches these filters" : "no jobs yet"),
      8,
    );
    for (const row of $("#jobs tbody").rows) row.classList.toggle("selected", row.dataset.job === String(state.selectedJobId));
    $("#jobs-older").hidden = !state.jobs.next;
    $("#jobs-newer").hidden = state.jobs.page === 0;
  }

  function archivedBadge() {
    return h("span", {class: "badge archived", title: "it left the replicated state (retention, the budget or a delete): read from the archive"}, "archived");
  }

  function setFilters(filters) {
    return Object.entries(filters).filter(([, value]) => (Array.isArray(value) ? value.length : value !== ""));
  }

  function hasFilters() {
    return setFilters(state.jobs.filters).length > 0;
  }

  /** Search with `filters` (the others cleared) from the newest job, and show them in the form. */
  function filterJobs(filters) {
    state.jobs.filters = {...NO_FILTERS, ...filters};
    resetBulk();
    writeSearchForm(state.jobs.filters);
    setError("search", null);
    state.jobs.cursors = [null];
    state.jobs.page = 0;
    refreshSoon();
  }

  /** "2026-01-31T09:05:03" in this browser's time zone (what a datetime-local input holds). */
  function localInputValue(ms) {
    if (ms === "" || ms === null || ms === undefined) return "";
    const date = new Date(ms);
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T` +
      `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
  }

  function writeSearchForm(filters) {
    $("#filter-status").value = filters.status;
    $("#filter-where").value = filters.archived;
    for (const name of TEXT_FILTERS) $(`#filter-${name}`).value = filters[name];
    for (const name of TIME_FILTERS) $(`#filter-${name.slice(0, -3).replaceAll("_", "-")}`).value = localInputValue(filters[name]);
    $("#filter-payload").value = filters.payload.map(([path, raw]) => `${path}=${raw}`).join("\n");
  }

  /** The search form as filters; an Error naming the field that does not read. */
  function readSearchForm() {
    const filters = {...NO_FILTERS, payload: [], status: $("#filter-status").value, archived: $("#filter-where").value};
    for (const name of TEXT_FILTERS) filters[name] = $(`#filter-${name}`).value.trim();
    for (const name of TIME_FILTERS) {
      const input = $(`#filter-${name.slice(0, -3).replaceAll("_", "-")}`);
      if (!input.value) continue;
      const ms = new Date(input.value).getTime(); // a datetime-local value is local time
      if (Number.isNaN(ms)) throw new Error(`${input.getAttribute("aria-label")}: not a time`);
      // Ranges include both ends: a "to" given to the minute (or second) includes all of it.
      const last = {16: 59999, 19: 999}[input.value.length] || 0;
      filters[name] = name.endsWith("_to_ms") ? ms + last : ms;
    }
    for (const what of ["created", "finished"]) {
      const from = filters[`${what}_from_ms`];
      const to = filters[`${what}_to_ms`];
      if (from !== "" && to !== "" && from > to) throw new Error(`${what}: the start is after the end`);
    }
    for (const text of $("#filter-payload").value.split("\n")) {
      const line = text.trim();
      if (!line) continue;
      const at = line.indexOf("=");
      const path = at > 0 ? line.slice(0, at).trim().replace(/^payload\./, "") : "";
      if (!path) throw new Error(`payload: “${line}” is not PATH=VALUE (e.g. customer.id=42)`);
      filters.payload.push([path, line.slice(at + 1).trim()]);
    }
    return filters;
  }

  // -- bulk actions on the jobs matching the filters -----------------------------------------

  const BULK_DONE = {cancel: "cancelled", retry: "retried", delete: "deleted"};
  const BULK_PARTS_MAX = 1000; // requests one count or action sends at most (20,000 ids each)

  /** The bulk filter: the job search's filters that are set (those a bulk action takes). */
  function bulkFilter() {
    const filter = {};
    for (const name of BULK_FILTERS) if (state.jobs.filters[name]) filter[name] = state.jobs.filters[name];
    return filter;
  }

  /** The search's filters a bulk action does not take: it acts on live jobs by BULK_FILTERS. */
  function filtersBulkCannotTake() {
    return setFilters(state.jobs.filters)
      .map(([name, value]) => (name === "archived" && value === "false" ? null : name))
      .filter((name) => name && !BULK_FILTERS.includes(name));
  }

  /** Send the parts of a bulk action (or its dry run) until the cluster says no more. */
  async function runBulk(action, filter, dryRun) {
    let matched = 0;
    let changed = 0;
    let cursor = 0;
    for (let part = 0; part < BULK_PARTS_MAX; part++) {
      const answer = await write("/v1/jobs/bulk", {action, filter, cursor, dry_run: dryRun});
      matched += answer.matched;
      changed += answer.changed;
      cursor = answer.next_cursor;
      if (!answer.more) break;
    }
    return {matched, changed};
  }

  function describeFilter(filter) {
    return Object.entries(filter).map(([name, value]) => `${name} ${value}`).join(", ");
  }

  function resetBulk() {
    state.bulk = null;
    $("#bulk-summary").textContent = "";
    $("#bulk-confirm").hidden = true;
  }

  async function countBulk() {
    const filter = bulkFilter();
    const action = $("#bulk-action").value;
    resetBulk();
    const others = filtersBulkCannotTake();
    if (others.length) {
      throw new Error(`a bulk action acts on live jobs by status, queue, task and schedule only: clear ${others.join(", ").replaceAll("_ms", "")} first`);
    }
    if (!Object.keys(filter).length) throw new Error("set at least one filter first (status, queue, task or schedule)");
    const {matched} = await runBulk(action, filter, true);
    $("#bulk-summary").textContent = `${matched} job${matched === 1 ? "" : "s"} match (${describeFilter(filter)})`;
    if (matched > 0) {
      state.bulk = {action, filter: JSON.stringify(filter)};
      const confirm = $("#bulk-confirm");
      confirm.textContent = `${action} ${matched} job${matched === 1 ? "" : "s"}`;
      confirm.hidden = false;
    }
    return `${action}: ${matched} matching job${matched === 1 ? "" : "s"} counted`;
  }

  async function confirmBulk() {
    const counted = state.bulk;
    const filter = bulkFilter();
    // What was counted is what is acted on: a filter or action changed since needs a new count.
    if (!counted || counted.filter !== JSON.stringify(filter) || counted.action !== $("#bulk-action").value) {
      resetBulk();
      throw new Error("the filters changed since the count: count again");
    }
    resetBulk();
    const {matched, changed} = await runBulk(counted.action, filter, false);
    return `${BULK_DONE[counted.action]} ${changed} of ${matched} matching jobs`;
  }

  /** Open job `id`'s page (the detail beside the table); the address says which (#job=ID). */
  function selectJob(id) {
    state.selectedJobId = id;
    if (location.hash !== `#job=${id}`) history.replaceState(null, "", `#job=${id}`);
    const panel = $("#job-detail");
    panel.hidden = false;
    delete panel.dataset.signature; // so the detail is drawn even if it did not change
    panel.replaceChildren(h("p", {class: "muted"}, `loading job ${id}…`));
    for (const row of $("#jobs tbody").rows) row.classList.toggle("selected", row.dataset.job === String(id));
    loadJobDetail()
      .then(() => setError("job", null))
      .catch((error) => setError("job", error.describe ? error.describe() : String(error)))
      .finally(renderErrors);
  }

  function closeJob() {
    state.selectedJobId = null;
    if (location.hash.startsWith("#job=")) history.replaceState(null, "", location.pathname + location.search);
    $("#job-detail").hidden = true;
    for (const row of $("#jobs tbody").rows) row.classList.remove("selected");
  }

  function renderJobDetail(job, missing, extras = {}) {
    const panel = $("#job-detail");
    panel.hidden = false;
    const close = h("button", {type: "button", class: "quiet", title: "close", onclick: closeJob}, "close");
    if (!job) {
      delete panel.dataset.signature;
      panel.replaceChildren(h("header", {}, h("h3", {}, `job ${state.selectedJobId}`), close), h("p", {class: "muted"}, missing));
      return;
    }
    const signature = JSON.stringify([job, extras]);
    if (panel.dataset.signature === signature) return; // unchanged: keep scroll positions
    panel.dataset.signature = signature;
    const buttons = [];
    if (!job.archived && (job.status === "failed" || job.status === "cancelled")) {
      buttons.push(h("button", {type: "button", onclick: (event) => act(event.currentTarget, `retry job ${job.id}`, () => retryJob(job.id))}, "retry"));
    }
    if (!FINAL.has(job.status)) {
      buttons.push(h("button", {type: "button", class: "danger", onclick: (event) => act(event.currentTarget, `cancel job ${job.id}`, () => cancelJob(job.id))}, "cancel"));
    }
    const fields = [
      ["key", job.key],
      ["task", job.task],
      ["queue", job.queue],
      ["priority", job.priority],
      ["attempts", attemptsText(job)],
      ["kept", job.archived ? "in the archive: it left the replicated state (retention, the budget or a delete)" : "in the replicated state"],
      ["depends on", job.depends_on && job.depends_on.length ? job.depends_on.join(", ") : null],
      ["run at", job.run_at_ms ? when(job.run_at_ms) : null],
      ["created", when(job.created_ms)],
      ["finished", job.finished_ms ? when(job.finished_ms) : null],
      ["worker", job.worker],
      ["lease until", job.lease_until_ms ? when(job.lease_until_ms) : null],
      ["timeout", job.timeout_ms ? `${job.timeout_ms / 1000} s` : null],
      ["concurrency", job.concurrency ? `key ${job.concurrency.key}, at most ${job.concurrency.max} running` : null],
      ["rate", job.rate ? `key ${job.rate.key}, at most ${job.rate.max} starts per ${job.rate.per_ms % 1000 ? `${job.rate.per_ms} ms` : `${job.rate.per_ms / 1000} s`}` : null],
      ["fairness", job.fairness ? `key ${job.fairness.key}, ${job.fairness.weight} a turn` : null],
      ["trace", job.traceparent ? job.traceparent.split("-")[1] : null],
      ["cancelled", job.cancel_reason],
    ].filter(([, value]) => value !== null && value !== undefined && value !== "");
    const history = job.history || [];
    const blocks = [
      h("header", {}, h("h3", {}, `job ${job.id}`), badge(job.status), job.archived ? archivedBadge() : null, ...buttons, close),
      h("dl", {}, fields.map(([name, value]) => [h("dt", {}, name), h("dd", {}, value)])),
      progressBlock(job),
      job.error ? [h("h3", {}, "error"), h("pre", {dataset: {testid: "job-error"}}, job.error)] : null,
      outputBlocks(job.result),
      h("h3", {}, "payload"),
      h("pre", {dataset: {testid: "job-payload"}}, JSON.stringify(job.payload, null, 2)),
      scheduleBlock(job, extras.schedule),
      workflowBlock(job, extras.workflow),
      h("h3", {}, `attempts (${history.length})`),
      history.length
        ? h(
            "table",
            {class: "attempts", dataset: {testid: "attempts"}},
            h("thead", {}, h("tr", {}, ["#", "worker", "node", "started", "took", "outcome"].map((name) => h("th", {}, name)))),
            h(
              "tbody",
              {},
              history.map((attempt) => [
                h(
                  "tr",
                  {class: "attempt", title: `fencing token ${attempt.token}`},
                  h("td", {class: "num"}, attempt.attempt),
                  h("td", {}, attempt.worker || "—"),
                  h("td", {}, attempt.node || "—"),
                  h("td", {}, when(attempt.start_ms, {showRelative: false})),
                  h("td", {class: "num"}, attempt.end_ms && attempt.start_ms ? `${((attempt.end_ms - attempt.start_ms) / 1000).toFixed(2)} s` : "—"),
                  h("td", {}, badge(attempt.outcome)),
                ),
                // The attempt's error on a row of its own, under the attempt it belongs to.
                attempt.error ? h("tr", {class: "attempt-error"}, h("td", {}), h("td", {colspan: 5}, h("pre", {}, attempt.error))) : null,
              ]),
            ),
          )
        : h("p", {class: "muted"}, "not attempted yet"),
    ];
    // Its buttons stay the same elements while the job's progress redraws the rest.
    morphChildren(panel, blocks.flat(Infinity).filter(Boolean));
    tickRelativeTimes();
  }

  /**
   * The job's newest progress report as a bar: "how far" ({done, total} or a fraction), its
   * message and data, when it came and from which attempt. A report of an attempt that ended
   * is said to be its last (a retry's new attempt starts with none).
   */
  function progressBlock(job) {
    const progress = job.progress;
    if (!progress) return null;
    const value = progress.value;
    const counted = value !== null && typeof value === "object";
    const share = counted ? value.done / value.total : Number(value);
    const percent = `${Math.floor(share * 100)}%`;
    const current = job.status === "running" && progress.attempt === job.attempts;
    const caption = [
      counted ? `${percent} (${value.done} of ${value.total})` : percent,
      progress.message ? ` — ${progress.message}` : "",
    ].join("");
    return [
      h("h3", {}, current ? "progress" : `progress (the last of attempt ${progress.attempt})`),
      h(
        "div",
        {class: "progress", dataset: {testid: "job-progress"}},
        h("progress", {max: 1, value: share, title: percent, "aria-label": `progress ${percent}`}),
        h("span", {class: "progress-caption", dataset: {testid: "job-progress-caption"}}, caption),
        h("span", {class: "muted"}, " reported ", when(progress.at_ms)),
      ),
      progress.data !== null && progress.data !== undefined
        ? h("pre", {dataset: {testid: "job-progress-data"}}, JSON.stringify(progress.data, null, 2))
        : null,
    ];
  }

  /** The schedule that fired the job: its name, the fire time, and what it is now. */
  function scheduleBlock(job, found) {
    if (!job.schedule || !found) return null;
    const view = found.view;
    const now = view
      ? `${describeSpec(view.spec)}, ${view.paused ? "paused" : "active"}`
      : found.gone ? "deleted since" : `not read: ${found.error}`;
    const jobs = h("button", {type: "button", class: "quiet", onclick: () => filterJobs({schedule: job.schedule})}, "its jobs");
    return [
      h("h3", {}, "schedule"),
      h(
        "dl",
        {dataset: {testid: "job-schedule"}},
        h("dt", {}, "fired by"), h("dd", {}, job.schedule, " ", jobs),
        h("dt", {}, "fire time"), h("dd", {}, job.fire_time_ms === null ? "—" : when(job.fire_time_ms)),
        h("dt", {}, "the schedule"), h("dd", {}, now),
      ),
    ];
  }

  /** The workflow (DAG) the job belongs to: each job at its step (0 for the roots, else one
   * more than its deepest parent), with the names of the jobs it waits for. */
  function workflowBlock(job, found) {
    if (job.workflow_id === null || job.workflow_id === undefined || !found) return null;
    const title = h("h3", {}, `workflow ${job.workflow_id}`);
    if (found.error) return [title, h("p", {class: "muted"}, `not read: ${found.error}`)];
    const byId = new Map(found.jobs.map((member) => [member.id, member]));
    const steps = new Map();
    const stepOf = (member, depth = 0) => {
      if (!steps.has(member.id)) {
        const parents = member.depends_on.map((id) => byId.get(id)).filter(Boolean);
        // A workflow is acyclic (the core refuses a cycle); the depth bound is a guard only.
        const step = depth > WORKFLOW_JOBS_MAX ? 0 : Math.max(-1, ...parents.map((parent) => stepOf(parent, depth + 1))) + 1;
        steps.set(member.id, step);
      }
      return steps.get(member.id);
    };
    const members = [...found.jobs].sort((a, b) => stepOf(a) - stepOf(b) || a.id - b.id);
    const nameOf = (id) => (byId.has(id) ? byId.get(id).workflow_node || `#${id}` : `#${id}`);
    return [
      title,
      h(
        "table",
        {class: "workflow", dataset: {testid: "workflow"}},
        h("thead", {}, h("tr", {}, ["step", "job", "name", "status", "after"].map((name) => h("th", {}, name)))),
        h(
          "tbody",
          {},
          members.map((member) =>
            h(
              "tr",
              {
                class: member.id === job.id ? "current" : null,
                "aria-current": member.id === job.id ? "true" : null,
                dataset: {job: String(member.id)},
                onclick: member.id === job.id ? null : () => selectJob(member.id),
              },
              h("td", {class: "num"}, stepOf(member)),
              h("td", {class: "num"}, member.id),
              h("td", {}, member.workflow_node || "—"),
              h("td", {}, badge(member.status), member.archived ? archivedBadge() : null),
              h("td", {}, member.depends_on.length ? member.depends_on.map(nameOf).join(", ") : "—"),
            ),
          ),
        ),
      ),
      found.partial ? h("p", {class: "muted"}, "more jobs than one read shows") : null,
      byId.size < 1 ? h("p", {class: "muted"}, "none of its jobs is kept any more") : null,
    ];
  }

  /** A job's result: a shell task's exit code and output, or any other result as JSON. */
  function outputBlocks(result) {
    if (result === null || result === undefined) return null;
    const isShell = typeof result === "object" && ("stdout" in result || "stderr" in result);
    if (!isShell) return [h("h3", {}, "result"), h("pre", {dataset: {testid: "job-output"}}, JSON.stringify(result, null, 2))];
    const truncated = result.truncated ? " (truncated)" : "";
    return [
      h("h3", {}, `output: exit code ${result.exit_code ?? "?"}${truncated}`),
      h("pre", {dataset: {testid: "job-output"}}, result.stdout || "(no standard output)"),
      result.stderr ? [h("h3", {}, "standard error"), h("pre", {}, result.stderr)] : null,
    ];
  }

  async function retryJob(id) {
    const answer = await write(`/v1/jobs/${id}/retry`);
    if (state.selectedJobId === id) loadJobDetail().catch(() => {});
    return `job ${id} is ${answer.status} again`;
  }

  async function cancelJob(id) {
    const answer = await write(`/v1/jobs/${id}/cancel`, {reason: "cancelled from the dashboard"});
    return `job ${id} ${answer.status}` + (answer.cancelled_descendants ? ` (and ${answer.cancelled_descendants} dependent jobs)` : "");
  }

  function renderDeadLetter(jobs, more) {
    renderRows(
      $("#dead tbody"),
      jobs,
      (job) => job.id,
      (job) =>
        h(
          "tr",
          {dataset: {job: String(job.id)}},
          h("td", {class: "num"}, h("a", {href: "#jobs-panel", onclick: () => selectJob(job.id)}, job.id)),
          h("td", {}, job.task),
          h("td", {}, job.queue),
          h("td", {class: "num"}, attemptsText(job)),
          h("td", {class: "wrap mono error-text", title: job.error || null}, firstLine(job.error, 100) || "—"),
          h("td", {}, when(job.finished_ms)),
          h(
            "td",
            {class: "actions"},
            h("button", {type: "button", onclick: (event) => act(event.currentTarget, `retry job ${job.id}`, () => retryJob(job.id))}, "retry"),
          ),
        ),
      "empty: no job has failed for good",
      7,
    );
    $("#dead-panel h2 small").textContent = more ? "(failed for good; the newest 50)" : "(failed for good)";
  }

  // -- rendering: events ---------------------------------------------------------------------

  function describeEvent(event) {
    switch (event.kind) {
      case "fired":
        return [`${event.schedule} fired for ${clock(event.fire_time_ms)}`, event.job ? ` → job ${event.job}` : ""];
      case "overlap_skipped":
        return `${event.schedule} skipped ${clock(event.fire_time_ms)}: a run is in progress (overlap ${event.policy})`;
      case "misfired":
        return `${event.schedule} missed ${event.missed} fire time(s); fired ${event.fired} (misfire ${event.policy})`;
      case "lease_expired":
        return `job ${event.job}: lease of worker ${event.worker} expired (token ${event.token})`;
      case "dead_lettered":
        return `job ${event.job} failed for good after ${event.attempts} attempt(s): ${firstLine(event.error, 100)}`;
      case "leader_changed":
        return `${event.node} leads (term ${event.term})` + (event.leases_extended ? `, ${event.leases_extended} leases extended` : "");
      default: {
        const {seq, time_ms, kind, ...fields} = event;
        return JSON.stringify(fields);
      }
    }
  }

  function renderEvents() {
    const list = $("#events");
    const newest = [...state.events].reverse();
    if (!newest.length) {
      list.replaceChildren(h("li", {class: "muted"}, "no events yet"));
      return;
    }
    list.replaceChildren(
      ...newest.map((event) =>
        h(
          "li",
          {dataset: {kind: event.kind}},
          h("time", {}, event.time_ms ? clock(event.time_ms) : "—"),
          h("span", {class: "kind"}, badge(event.kind.replace(/_/g, " "), event.kind === "dead_lettered" ? "failed" : event.kind === "fired" ? "queued" : "unknown")),
          h("span", {}, describeEvent(event)),
        ),
      ),
    );
  }

  // -- the refresh loop ----------------------------------------------------------------------

  // -- activity charts (drawn by charts.js) ---------------------------------------------------

  function chartRate(value) {
    if (value === 0) return "0/s";
    const digits = value >= 10 ? 0 : value >= 1 ? 1 : 2;
    return `${value.toFixed(digits)}/s`;
  }

  function chartMs(value) {
    if (value >= 1000) return `${(value / 1000).toFixed(1)} s`;
    return `${value.toFixed(value >= 10 || value === 0 ? 0 : 1)} ms`;
  }

  /** A sample's rates of `counter` for the queues `pick` chooses (summed); null in a gap. */
  function rateOf(sample, counter, pick) {
    if (sample.gap) return null;
    let sum = 0;
    for (const [queue, rates] of Object.entries(sample.queues)) {
      if (pick(queue)) sum += rates[`${counter}_per_s`];
    }
    if (sample.other_queues && pick(null)) sum += sample.other_queues[`${counter}_per_s`];
    return sum;
  }

  function throughputSeries(samples, pick) {
    return CHART_COUNTERS.map(([counter, label]) => ({
      name: counter, label, points: samples.map((s) => [s.at_ms, rateOf(s, counter, pick)]),
    }));
  }

  /** The queues that moved most over the samples, busiest first. */
  function busiestQueues(samples) {
    const jobs = new Map();
    for (const sample of samples) {
      for (const [queue, rates] of Object.entries(sample.queues)) {
        const moved = CHART_COUNTERS.reduce((sum, [counter]) => sum + rates[`${counter}_per_s`], 0);
        jobs.set(queue, (jobs.get(queue) || 0) + moved * sample.interval_ms);
      }
    }
    return [...jobs.entries()].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).map(([q]) => q);
  }

  function renderActivity() {
    const {lineChart} = window.raftcronCharts;
    const {node, samples, sampleMs, keptMs} = state.activity;
    const toMs = Math.max(nowMs(), samples.length ? samples[samples.length - 1].at_ms : 0);
    const shown = Math.min(keptMs, Math.max(CHART_SPAN_MIN_MS, samples.length ? toMs - samples[0].at_ms : 0));
    const fromMs = toMs - shown;
    const minutes = Math.round(shown / 60000);
    const period = minutes > 1 ? `the last ${minutes} min` : "the last minute";
    const measured = samples.some((s) => !s.gap);
    const waiting = `waiting for this node's first samples (every ${sampleMs / 1000} s)`;
    const gaps = samples.filter((s) => s.gap && s.interval_ms > 0).map((s) => [s.at_ms - s.interval_ms, s.at_ms]);
    $("#activity-note").textContent = `${period}, sampled by ${node} every ${sampleMs / 1000} s`;

    lineChart($("#chart-throughput"), {
      title: "jobs per second, all queues", yLabel: "jobs / s", format: chartRate, fromMs, toMs, gaps,
      series: throughputSeries(samples, () => true),
      emptyText: measured ? `no jobs in ${period}` : waiting,
    });
    lineChart($("#chart-latency"), {
      title: "claim latency (claims this node served)", yLabel: "ms", format: chartMs, fromMs, toMs, gaps,
      series: [["p50", "median (p50)", 0.5], ["p99", "p99", 0.99]].map(([name, label]) => ({
        name, label,
        points: samples.map((s) => [s.at_ms, s.claims && s.claims.count ? s.claims[`${name}_ms`] : null]),
      })),
      emptyText: measured ? `no claims served by this node in ${period}` : waiting,
    });

    const box = $("#queue-charts");
    const queues = busiestQueues(samples.filter((s) => s.at_ms >= fromMs)).slice(0, QUEUE_CHARTS_MAX);
    const figures = queues.map((queue) => {
      const figure = [...box.children].find((child) => child.dataset.queue === queue)
        || h("figure", {class: "chart", dataset: {queue, testid: "queue-chart"}});
      lineChart(figure, {
        title: `queue ${queue}`, yLabel: "jobs / s", format: chartRate, fromMs, toMs, gaps,
        series: throughputSeries(samples, (name) => name === queue),
        emptyText: `no jobs in ${period}`,
      });
      return figure;
    });
    box.replaceChildren(...figures);
  }

  const SOURCES = [
    ["this node", loadCluster],
    ["schedules", loadSchedules],
    ["jobs", loadJobs],
    ["dead letter", loadDeadLetter],
    ["queues", loadQueues],
    ["state", loadUsage],
    ["activity", loadActivity],
    ["notifications", loadNotifications],
    ["events", loadEvents],
    ["job", loadJobDetail],
  ];

  async function refresh() {
    clearTimeout(state.timer);
    if (state.busy) return;
    if (state.tokenNeeded) {
      setFreshness("waiting for a token", "stale");
      return; // the token dialog's answer starts the next refresh
    }
    state.busy = true;
    state.metricsRequest = null;
    try {
      const results = await Promise.allSettled(SOURCES.map(([, load]) => load()));
      results.forEach((result, index) => {
        const source = SOURCES[index][0];
        const error = result.status === "rejected" ? result.reason : null;
        // A 401 is answered by the token dialog, not listed as an error.
        const shown = error && !(error.status === 401) ? (error.describe ? error.describe() : String(error)) : null;
        setError(source, shown);
        if (error && !(error instanceof ApiError)) console.error(source, error);
      });
      if (results[0].status === "fulfilled") {
        state.lastOkMs = Date.now();
        setFreshness(`updated ${clock(Date.now())}`, state.errors.size ? "" : "live");
      } else if (state.lastOkMs) {
        setFreshness(`stale: last answer ${clock(state.lastOkMs)}`, "stale");
      } else {
        setFreshness("no answer yet", "stale");
      }
      renderErrors();
      tickRelativeTimes();
    } finally {
      state.busy = false;
      schedule();
    }
  }

  function schedule() {
    clearTimeout(state.timer);
    if (state.refreshS > 0 && !state.tokenNeeded) state.timer = setTimeout(refresh, state.refreshS * 1000);
  }

  function refreshSoon() {
    clearTimeout(state.timer);
    state.timer = setTimeout(refresh, 50);
  }

  function setFreshness(text, kind) {
    const element = $("#freshness");
    element.textContent = text;
    element.className = `freshness ${kind}`;
  }

  // -- wiring --------------------------------------------------------------------------------

  function start() {
    const fromUrl = Number(new URLSearchParams(location.search).get("refresh"));
    if (fromUrl > 0) state.refreshS = fromUrl;
    const select = $("#refresh-s");
    if (![...select.options].some((option) => Number(option.value) === state.refreshS)) {
      select.append(h("option", {value: String(state.refreshS)}, `${state.refreshS} s`));
    }
    select.value = String(state.refreshS);
    select.addEventListener("change", () => {
      state.refreshS = Number(select.value);
      refreshSoon();
    });

    $("#job-filters").addEventListener("submit", (event) => {
      event.preventDefault();
      const id = Number($("#filter-job").value.trim());
      if (Number.isInteger(id) && id > 0) {
        $("#filter-job").value = "";
        selectJob(id);
      }
      let filters;
      try {
        filters = readSearchForm();
      } catch (error) {
        setError("search", error.message); // the search shown stays as it was
        renderErrors();
        return;
      }
      filterJobs(filters);
    });
    $("#filter-status").addEventListener("change", () => $("#job-filters").requestSubmit());
    $("#bulk-action").addEventListener("change", resetBulk);
    $("#bulk-count").addEventListener("click", (event) => act(event.currentTarget, "count", countBulk));
    $("#bulk-confirm").addEventListener("click", (event) => act(event.currentTarget, "bulk action", confirmBulk));
    $("#filter-clear").addEventListener("click", () => filterJobs({}));
    $("#notifications-reload").addEventListener("click", () => {
      state.notifications.reload = true;
      refreshSoon();
    });
    $("#jobs-older").addEventListener("click", () => {
      const jobs = state.jobs;
      if (!jobs.next) return;
      jobs.cursors = jobs.cursors.slice(0, jobs.page + 1).concat([jobs.next]);
      jobs.page += 1;
      refreshSoon();
    });
    $("#jobs-newer").addEventListener("click", () => {
      state.jobs.cursors = [null];
      state.jobs.page = 0;
      refreshSoon();
    });

    $("#token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = $("#token-input").value.trim();
      if (token) useToken(token);
    });
    $("#token-dialog").addEventListener("cancel", () => {
      // Escape closes the dialog; the page says what it waits for and how to go on.
      setError("token", "this node needs an API token to answer; use “enter token” above");
      $("#token-button").textContent = "enter token";
      renderErrors();
    });
    $("#token-button").hidden = !state.token;
    $("#token-button").addEventListener("click", () => {
      state.tokenNeeded = true;
      openTokenDialog(null);
    });

    // A job's page has an address (#job=ID): opened from a link, or when the address changes.
    const openFromAddress = () => {
      const match = /^#job=(\d{1,18})$/.exec(location.hash);
      if (match && Number(match[1]) !== state.selectedJobId) selectJob(Number(match[1]));
    };
    window.addEventListener("hashchange", openFromAddress);
    openFromAddress();

    setInterval(tickRelativeTimes, 1000);
    refresh();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
