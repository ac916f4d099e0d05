// Re-renders the dashboard tables from the staff-only JSON endpoint every few seconds. The server
// writes every duration and date out (locks/formats.py): this script shows them as they come.
(function () {
  "use strict";
  var root = document.getElementById("locks-dashboard");
  if (!root) return;
  var every = 3000, canRelease = root.dataset.canRelease === "1";
  function esc(s) { return String(s).replace(/[&<>"']/g, function (c) { return "&#" + c.charCodeAt(0) + ";"; }); }
  // On a phone each row is a card (dashboard.css): every cell is labelled with its column's header.
  function label(table) {
    if (!table) return;
    var heads = Array.prototype.map.call(table.querySelectorAll("thead th"), function (th) { return th.textContent.trim(); });
    Array.prototype.forEach.call(table.querySelectorAll("tbody tr, tfoot tr"), function (tr) {
      var column = 0;
      Array.prototype.forEach.call(tr.children, function (td) {
        if (!td.hasAttribute("data-label") && td.colSpan === 1) td.setAttribute("data-label", heads[column] || "");
        column += td.colSpan;
      });
    });
  }
  function labelAll() { Array.prototype.forEach.call(root.querySelectorAll("table.cards"), label); }
  function stuck(h) { return h.stuck ? '<span class="stuck" title="' + esc(h.stuck_title) + '">stuck?</span>' : ""; }
  var goneTitle = "Its row was deleted (a load test's product, say): nothing to open. Its statistics stay until they expire or are reset.";
  function link(row) {
    if (row.url) return '<a href="' + esc(row.url) + '">' + esc(row.name) + "</a>";
    if (row.gone) return '<span class="gone" title="' + esc(goneTitle) + '">' + esc(row.name) + " (gone)</span>";
    return esc(row.name);
  }
  function render(data) {
    var held = data.held.map(function (h) {
      var release = canRelease ? '<a href="' + esc(root.dataset.releaseUrl.replace("NAME", encodeURIComponent(h.name))) + '">Force release…</a>' : "";
      return '<tr><td class="name">' + link(h) + '</td><td class="name">' + esc(h.owner) + '</td><td class="num">' + esc(h.fence) +
        '</td><td class="num held-for">' + esc(h.held_for_text) + stuck(h) + '</td><td class="num">' + esc(h.ttl_left_text) +
        '</td><td class="num">' + esc(h.waiters) + '</td><td class="num">' + esc(h.queued_requests) +
        (h.queued_requests_more ? "+" : "") + "</td><td>" + release + "</td></tr>";
    });
    document.querySelector("#held-locks tbody").innerHTML = held.join("") || '<tr><td colspan="8">No lock is held.</td></tr>';
    document.getElementById("held-count").textContent = "(" + data.held.length + (data.next_cursor ? "+" : "") + ")";
    var stats = data.stats.map(function (s) {
      var names = s.top_names.map(function (n) { return link(n) + " (" + esc(n.acquired) + ")"; }).join(", ") || "-";
      return '<tr><td class="name">' + esc(s.name) + '</td><td class="names">' + names + '</td><td class="num">' + s.acquired + '</td><td class="num">' +
        Math.round(s.contention * 100) + ' %</td><td class="num">' + s.timeouts + '</td><td class="num">' + s.lost +
        '</td><td class="num">' + s.force_released + '</td><td class="num">' + esc(s.wait_p50_text) + '</td><td class="num">' +
        esc(s.wait_p99_text) + '</td><td class="num">' + esc(s.hold_p50_text) + '</td><td class="num">' + esc(s.hold_p99_text) + "</td></tr>";
    });
    document.getElementById("stats-count").textContent = data.stats.length + " of " + data.stats_families;
    document.querySelector("#lock-stats tbody").innerHTML = stats.join("") || '<tr><td colspan="11">No lock activity yet.</td></tr>';
    var combining = data.combining.map(function (s) {
      return '<tr><td class="name">' + esc(s.name) + '</td><td class="num">' + s.batches + '</td><td class="num">' + s.batched_requests +
        '</td><td class="num">' + (s.mean_batch === null ? "-" : esc(s.mean_batch)) + '</td><td class="num">&le; ' + esc(s.batch_p50) +
        '</td><td class="num">&le; ' + esc(s.batch_p99) + "</td><td>" + esc(s.batch_sizes_text) + '</td><td class="num" title="' +
        esc(s.last_batch_at_text) + '">' + esc(s.last_batch_text) + "</td></tr>";
    });
    document.querySelector("#lock-combining tbody").innerHTML = combining.join("") || '<tr><td colspan="8">No combining batch yet.</td></tr>';
    var t = data.totals, totals = document.getElementById("lock-totals");
    if (totals) totals.innerHTML = '<td data-label="">Total</td><td></td><td class="num">' + t.acquired + '</td><td class="num">' +
      Math.round(t.contention * 100) + ' %</td><td class="num">' + t.timeouts + '</td><td class="num">' + t.lost +
      '</td><td class="num">' + t.force_released + '</td><td colspan="4"></td>';
    (data.panels || []).forEach(function (p) {
      var box = document.getElementById("panel-" + p.id);
      if (!box) return;
      var note = box.querySelector(".panel-note");
      if (note && p.note) note.textContent = "(" + p.note + ")";
      box.querySelector("tbody").innerHTML = p.rows.map(function (row) {
        return "<tr>" + row.map(function (cell, i) {
          return "<td" + (i ? ' class="num"' : "") + ">" + esc(cell) + "</td>";
        }).join("") + "</tr>";
      }).join("");
    });
    document.getElementById("refresh-state").textContent = "Updated " + data.at_text + ".";
    labelAll();
  }
  function tick() {
    var params = new URLSearchParams(window.location.search);
    fetch(root.dataset.url + "?" + params.toString(), {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(render)
      .catch(function (e) { document.getElementById("refresh-state").textContent = "Refresh failed (" + e.message + "); retrying."; })
      .finally(function () { setTimeout(tick, every); });
  }
  labelAll();
  setTimeout(tick, every);
})();
