// Live pages (dashboard and admin): one WebSocket to /ws/live/, no polling.
// The server pushes a "snapshot" on connect and an "update" on every refresh of its feed;
// this script redraws whatever [data-live=...] elements the page has. When the socket drops,
// the page says so and reconnects (1 s, doubling to 10 s).
(function () {
  "use strict";

  var COLORS = ["#2f6fdf", "#d9480f", "#2b8a3e", "#9c36b5", "#e67700", "#0b7285", "#c2255c", "#5c940d"];
  var HISTORY_SECONDS = 300;
  var history = [];          // [{t, rates: {stream: facts/s}}]
  // "live": the feed's last 5 minutes; "day": per-minute samples from the database
  // (/facts-per-minute.json, fetched when chosen: the socket carries only the live feed).
  var chartRange = "live";
  var dayPoints = [];
  var lastState = null;
  var streamColors = {};
  var retryDelay = 1000;
  var socket = null;

  function $all(name) { return document.querySelectorAll('[data-live="' + name + '"]'); }

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    if (attrs) {
      for (var key in attrs) {
        if (key === "text") node.textContent = attrs[key];
        else if (key === "className") node.className = attrs[key];
        else node.setAttribute(key, attrs[key]);
      }
    }
    (children || []).forEach(function (child) {
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
    return node;
  }

  // An identifier that may wrap only right after its own separators (": . / _"), never inside a
  // word: its text with a <wbr> after each (as common/breakable.py does on the server).
  function breakable(text) {
    var nodes = [];
    String(text).split(/(?<=[:.\/_])(?=.)/).forEach(function (part, i) {
      if (i) nodes.push(document.createElement("wbr"));
      nodes.push(document.createTextNode(part));
    });
    return nodes;
  }

  // A table in a box of its own that scrolls sideways when the table is wider than the page.
  function scrollBox(table) { return el("div", {className: "scroll-x"}, [table]); }

  function setStatus(state, text) {
    document.querySelectorAll(".live-status").forEach(function (node) {
      node.dataset.state = state;
      node.textContent = text;
    });
  }

  // The banner: red with the reasons while a part this process depends on (database, Redis,
  // the replication endpoint, Celery) is failing, not just when the socket is down.
  var health = null;
  function showHealth() {
    if (health && health.status === "failing") {
      setStatus("failing", "Not ready — " + (health.reasons || []).join("; "));
    } else {
      setStatus("live", "Live");
    }
  }

  // The server's format (synapse_repl/formats): "2026-11-24 06:05:38 UTC".
  function clock(t) { return new Date(t * 1000).toISOString().slice(0, 19).replace("T", " ") + " UTC"; }

  // A time that may wrap at its spaces, never inside its date ("2026-11-|29").
  function when(t) {
    var text = clock(t), space = text.indexOf(" ");
    return el("span", {className: "when"}, [el("span", {text: text.slice(0, space)}), text.slice(space)]);
  }

  function ago(t, now) {
    if (t === null || t === undefined) return "never";
    var s = Math.max(0, Math.round(now - t));
    if (s < 90) return s + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    return clock(t);
  }

  function colorOf(stream) {
    if (!(stream in streamColors)) {
      streamColors[stream] = COLORS[Object.keys(streamColors).length % COLORS.length];
    }
    return streamColors[stream];
  }

  // -- streams table -----------------------------------------------------------------------

  function renderStreams(state) {
    var last = history.length ? history[history.length - 1].rates : {};
    $all("streams").forEach(function (tbody) {
      var rows = state.streams.map(function (s) {
        // Every writer with a recorded position, and configured writers that have none yet
        // (the server's order), each with its last write and whether its process still runs.
        var positions = Object.keys(s.writer_status || {});
        var posCell = el("td", null, positions.length ? positions.map(function (w) {
          var info = s.writer_status[w];
          var known = info.position !== null;
          var gone = info.gone;
          var last = null;
          if (info.last_write !== null) {
            last = [" last write ", when(info.last_write), " (" + ago(info.last_write, state.t) + ")" +
              (info.pid ? " by pid " + info.pid : "") + (info.alive === null && info.host ? " on " + info.host : "")];
          }
          return el("div", {className: gone ? "writer-row gone" : "writer-row"}, [
            el("span", {className: "writer", text: w}), ": ",
            el("span", {className: known ? "position" : "position muted", "data-stream": s.name, "data-writer": w,
                        text: known ? String(info.position) : "nothing written yet"}),
            s.ahead[w] && !gone ? el("span", {className: "ahead", text: " +" + s.ahead[w]}) : "",
            gone ? el("strong", {className: "gone", text: " exited unexpectedly",
                                 title: "its process is gone without closing the writer cleanly (killed or crashed)"}) : "",
            info.finished ? el("span", {className: "finished muted", text: " finished",
                                        title: "its process closed the writer cleanly and exited"}) : "",
            last ? el("span", {className: "last-write muted"}, last) : "",
          ]);
        }) : [el("span", {className: "muted", text: "none"})]);
        var pendingCell = el("td", null, s.pending.length ? s.pending.map(function (p) {
          return el("div", {className: p.stuck ? "pending stuck" : "pending"}, [
            p.stuck ? el("strong", {className: "warn", text: "STUCK "}) : "",
            p.writer + ": " + p.stream_ids.join(", ") + " (" + p.age_seconds.toFixed(1) + " s)",
          ]);
        }) : [el("span", {className: "muted", text: "none"})]);
        var rate = s.db_backed && (s.name in last) ? last[s.name].toFixed(1) : "";
        return el("tr", {"data-stream": s.name, className: s.stuck ? "stuck" : ""}, [
          el("td", null, [s.name, s.db_backed ? "" : el("span", {className: "muted", text: " (in memory)"}),
            s.backwards ? el("span", {className: "muted backwards", text: " (counts down)", title: state.backwards_note}) : ""]),
          posCell,
          el("td", {className: "linear", "data-stream": s.name}, [s.linear === null ? "" : String(s.linear),
            s.laggard ? el("span", {className: "held-by muted", text: " held by " + s.laggard}) : ""]),
          pendingCell,
          el("td", {className: "rate", text: rate}),
        ]);
      });
      tbody.replaceChildren.apply(tbody, rows);
    });
    $all("stuck").forEach(function (box) {
      var warnings = [];
      state.streams.forEach(function (s) {
        if (s.writers_warning) {
          warnings.push(el("p", {className: "stuck-warning writers-warning"}, [
            el("strong", {text: "WRITERS DISAGREE"}), " " + s.writers_warning]));
        }
        s.pending.forEach(function (p) {
          if (p.stuck) {
            warnings.push(el("p", {className: "stuck-warning"}, [
              el("strong", {text: "STUCK"}),
              " " + s.name + ": " + p.writer + " has held " + p.stream_ids.join(", ") + " for " +
                Math.round(p.age_seconds) + " s (pid " + p.pid + "); its transaction never completed, " +
                "so the linear position cannot pass it.",
            ]));
          }
        });
      });
      box.replaceChildren.apply(box, warnings);
    });
  }

  // -- facts/s chart (canvas) --------------------------------------------------------------

  // The chart's series: our database-backed streams, then an attached Synapse's ("Synapse events").
  function chartSeries(state) {
    return state.streams.filter(function (s) { return s.db_backed; }).map(function (s) { return s.name; })
      .concat(Object.keys(state.attached_rates || {}));
  }

  // An attached system's sections (a Synapse's), rendered by the server as the page renders it (its values
  // escaped there), replaced whole on each update.
  function renderAttached(state) {
    if (state.attached_html === undefined) return;
    $all("attached").forEach(function (box) { box.innerHTML = state.attached_html; });
  }

  function renderChart(state) {
    var now = state.t;
    var day = chartRange === "day";
    var span = day ? 86400 : HISTORY_SECONDS;
    var points = day ? dayPoints : history;
    $all("chart").forEach(function (canvas) {
      var ratio = window.devicePixelRatio || 1;
      var width = canvas.clientWidth || canvas.width, height = canvas.clientHeight || canvas.height;
      canvas.width = width * ratio;
      canvas.height = height * ratio;
      var ctx = canvas.getContext("2d");
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      ctx.clearRect(0, 0, width, height);
      var left = 48, right = 8, top = 8, bottom = 22;
      var streams = chartSeries(state);
      var max = 1;
      points.forEach(function (p) {
        streams.forEach(function (name) { max = Math.max(max, p.rates[name] || 0); });
      });
      // Four gridlines at round values: a tick of 1, 2, 2.5 or 5 times a power of ten.
      var raw = max / 4, power = Math.pow(10, Math.floor(Math.log10(raw)));
      var tick = [1, 2, 2.5, 5, 10].map(function (f) { return f * power; }).find(function (t) { return t >= raw; });
      max = tick * 4;
      var x = function (t) { return left + (width - left - right) * (1 - (now - t) / span); };
      var y = function (v) { return top + (height - top - bottom) * (1 - v / max); };
      ctx.font = "11px system-ui, sans-serif";
      ctx.strokeStyle = "#dde2ea";
      ctx.fillStyle = "#6b7385";
      ctx.lineWidth = 1;
      for (var i = 0; i <= 4; i++) {
        var v = max * i / 4, yy = Math.round(y(v)) + 0.5;
        ctx.beginPath(); ctx.moveTo(left, yy); ctx.lineTo(width - right, yy); ctx.stroke();
        ctx.fillText(Number.isInteger(v) ? String(v) : v.toFixed(1), 4, yy + 4);
      }
      var step = day ? 4 * 3600 : 60;
      for (var m = 0; m <= span; m += step) {
        var label = m === 0 ? "now" : day ? "-" + (m / 3600) + " h" : "-" + (m / 60) + " min";
        ctx.fillText(label, x(now - m) - (m === 0 ? 20 : 14), height - 6);
      }
      streams.forEach(function (name) {
        ctx.strokeStyle = colorOf(name);
        ctx.lineWidth = 2;
        ctx.beginPath();
        var started = false;
        points.forEach(function (p) {
          if (now - p.t > span) return;
          var px = x(p.t), py = y(p.rates[name] || 0);
          if (started) ctx.lineTo(px, py); else { ctx.moveTo(px, py); started = true; }
        });
        ctx.stroke();
      });
    });
    $all("legend").forEach(function (legend) {
      var last = history.length ? history[history.length - 1].rates : {};
      legend.replaceChildren.apply(legend, chartSeries(state).map(function (name) {
        return el("span", {className: "legend-item"}, [
          el("span", {className: "swatch", style: "background:" + colorOf(name)}),
          name + (name in last ? " " + last[name].toFixed(1) + "/s" : ""),
        ]);
      }));
    });
  }

  // -- connections -------------------------------------------------------------------------

  function renderEndpoints(state) {
    var now = state.t;
    $all("endpoints").forEach(function (box) {
      if (!state.endpoints.length) {
        box.replaceChildren(el("p", {className: "muted", text: "No replication endpoint has reported yet."}));
        return;
      }
      box.replaceChildren.apply(box, state.endpoints.map(function (e) {
        var c = e.counters;
        var connected = e.connections.map(function (conn) {
          return el("tr", {"data-peer": conn.peer}, [
            el("td", {className: "conn-name"}, breakable(conn.name)),
            el("td", {text: conn.peer}),
            el("td", null, [when(conn.connected_at), " (" + ago(conn.connected_at, now) + ")"]),
            el("td", {text: ago(conn.last_ping_at, now)}),
            el("td", {className: conn.outbound_queue > 1000 ? "warn" : "", text: String(conn.outbound_queue)}),
            el("td", {text: conn.streams.length ? conn.streams.join(", ") : "none yet"}),
            el("td", {title: conn.syncing_users.join("\n")}, conn.syncing_user_count ?
              [conn.syncing_user_count + ": "].concat(breakable(conn.syncing_users.slice(0, 5).join(", ")),
                                                       conn.syncing_user_count > 5 ? [", …"] : []) : ["none"]),
          ]);
        });
        if (!connected.length) connected = [el("tr", null, [el("td", {colspan: "7", className: "muted", text: "no worker connected"})])];
        var gone = e.recent_disconnects.slice(0, 20).map(function (d) {
          return el("tr", {className: "reason-" + d.reason.replace(/ /g, "-")}, [
            el("td", null, [when(d.at)]), el("td", null, breakable(d.name)), el("td", {text: d.peer}),
            el("td", {className: (d.reason === "shut down" || d.reason === "connection lost") ? "" : "warn", text: d.reason}),
            el("td", {className: "muted", text: d.detail === d.reason ? "" : d.detail}),
          ]);
        });
        if (!gone.length) gone = [el("tr", null, [el("td", {colspan: "5", className: "muted", text: "none"})])];
        var reasons = Object.keys(c.disconnects).map(function (r) { return r + ": " + c.disconnects[r]; }).join(", ");
        return el("section", {className: "endpoint", "data-endpoint": e.endpoint}, [
          el("h2", null, [e.endpoint, e.stale ? el("span", {className: "warn", text: " (silent for " + e.age_seconds + " s)"}) : ""]),
          el("p", {className: "muted", "data-figure": "Endpoint counters", text: "since " + clock(c.started_at) + ": " + c.connections + " connection" +
            (c.connections === 1 ? "" : "s") + " accepted · sent " +
            c.rdata_sent + " RDATA, " + c.position_sent + " POSITION" + (reasons ? " · disconnects: " + reasons : "")}),
          scrollBox(el("table", {className: "connections"}, [
            el("thead", null, [el("tr", null, ["Name", "Address", "Connected since", "Last PING", "Outbound queue",
              "Streams", "Syncing users"].map(function (h) { return el("th", {text: h}); }))]),
            el("tbody", null, connected),
          ])),
          el("h3", {text: "Recent disconnects"}),
          scrollBox(el("table", {className: "disconnects"}, [
            el("thead", null, [el("tr", null, ["At", "Name", "Address", "Reason", "Detail"].map(function (h) { return el("th", {text: h}); }))]),
            el("tbody", null, gone),
          ])),
        ]);
      }));
    });
  }

  // -- jobs ---------------------------------------------------------------------------------

  // A running job's status: its Spark progress, its Spark UI, and a cancel button.
  function statusCell(r) {
    var parts = [r.verdict_text || r.status];
    if (r.has_log) parts.push(" ", el("a", {href: "jobs/" + r.id + "/log", target: "_blank", text: "log"}));
    if (r.progress) parts.push(el("span", {className: "job-progress", text: " " + r.progress}));
    if (r.status === "running" && r.spark_ui_url) {
      parts.push(" ", el("a", {href: r.spark_ui_url, target: "_blank", rel: "noopener", text: "Spark UI"}));
    }
    if (r.status === "running" || r.status === "queued") {
      var token = document.querySelector("input[name=csrfmiddlewaretoken]");
      if (r.cancel_requested) parts.push(el("span", {className: "muted", text: " cancelling…"}));
      else if (token) {
        parts.push(" ", el("form", {method: "post", action: "jobs/" + r.id + "/cancel", className: "cancel-job"}, [
          el("input", {type: "hidden", name: "csrfmiddlewaretoken", value: token.value}),
          el("button", {type: "submit", text: "Cancel"}),
        ]));
      }
    }
    return parts;
  }

  function renderJobs(state) {
    if (!state.jobs) return;
    $all("jobs").forEach(function (body) {
      var rows = [];
      state.jobs.forEach(function (r) {
        rows.push(el("tr", {"data-status": r.status}, [
          el("td", {text: "#" + r.id}),
          el("td", null, breakable(r.job).concat(r.rooms ? [" (" + r.rooms + " rooms)"] : [])),
          el("td", {className: "status-" + (r.verdict || r.status)}, statusCell(r)),
          el("td", null, [when(r.started_at)]),
          el("td", {text: r.duration_seconds === null ? "running…" : r.duration_seconds + " s"}),
          el("td", {text: (r.rows_in === null ? "" : r.rows_in) + " / " + (r.rows_out === null ? "" : r.rows_out)}),
          el("td", {text: r.differences === null ? "" : String(r.differences)}),
          el("td", {text: r.trigger}),
          el("td", {className: "error", text: r.error}),
        ]));
        if (r.difference_rows && r.difference_rows.length) {
          rows.push(el("tr", {className: "differences"}, [el("td", {colspan: "9"}, [el("details", null, [
            el("summary", {text: "first " + r.difference_rows.length + " of " + r.differences + " differences"}),
            el("p", null, [el("a", {href: "jobs/" + r.id + "/findings", text: "all kept findings"})]),
            scrollBox(el("table", {className: "differences"}, [
              el("thead", null, [el("tr", null, r.difference_columns.map(function (c) { return el("th", {text: c}); }))]),
              el("tbody", null, r.difference_rows.map(function (row) {
                return el("tr", null, row.map(function (v) { return el("td", null, breakable(v)); }));
              })),
            ])),
          ])])]));
        }
      });
      if (!rows.length) rows = [el("tr", null, [el("td", {colspan: "9", className: "muted", text: "no runs yet"})])];
      body.replaceChildren.apply(body, rows);
    });
  }

  function chooseRange(range) {
    chartRange = range;
    $all("range").forEach(function (b) { b.setAttribute("aria-pressed", String(b.dataset.range === range)); });
    if (range !== "day") { if (lastState) renderChart(lastState); return; }
    fetch("/facts-per-minute.json?hours=24", {credentials: "same-origin"})
      .then(function (r) {
        window.factsPerMinuteStatus = r.status;
        return r.ok ? r.json() : {minutes: []};
      })
      .then(function (body) {
        dayPoints = body.minutes || [];
        window.factsPerMinutePoints = dayPoints.length;
        if (lastState) renderChart(lastState);
      });
  }

  document.addEventListener("click", function (ev) {
    var b = ev.target.closest && ev.target.closest('[data-live="range"]');
    if (b) chooseRange(b.dataset.range);
  });

  function render(state) {
    lastState = state;
    if (state.type === "snapshot") history = (state.history || []).slice();
    else if (state.sample) history.push(state.sample);
    while (history.length && state.t - history[0].t > HISTORY_SECONDS) history.shift();
    renderStreams(state);
    renderAttached(state);
    renderChart(state);
    renderEndpoints(state);
    renderJobs(state);
    $all("updated").forEach(function (node) { node.textContent = "updated " + clock(state.t); });
    window.liveUpdates = (window.liveUpdates || 0) + 1;
  }

  // -- the socket --------------------------------------------------------------------------

  function connect() {
    var url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws/live/";
    socket = new WebSocket(url);
    socket.onopen = function () { retryDelay = 1000; };
    socket.onmessage = function (event) {
      var message = JSON.parse(event.data);
      if (message.type === "snapshot" || message.type === "health") {
        if (message.health !== undefined) health = message.health;
        if (message.type === "health") health = message;
        showHealth();
      }
      if ((message.type === "snapshot" || message.type === "update") && message.streams) {
        if (message.type === "update") showHealth();
        render(message);
      }
    };
    socket.onclose = function (event) {
      if (event.code === 4403) {  // not (or no longer) signed in as staff
        setStatus("disconnected", "Signed out — sign in again to see live data.");
        location.href = "/admin/login/?next=" + encodeURIComponent(location.pathname);
        return;
      }
      setStatus("disconnected", "Disconnected — reconnecting in " + Math.round(retryDelay / 1000) + " s…");
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 10000);
    };
  }

  // Any page with live parts or the banner (which follows the service's health) connects.
  if (document.querySelector("[data-live], #live-status")) connect();
})();
