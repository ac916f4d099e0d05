// Drop countdowns that flip at the edge, by the server's clock: each [data-flip-at] element counts
// down from the server's time when the page was drawn (data-server-now) with the browser's
// monotonic clock, so a buyer's wrong clock moves nothing; its text is data-countdown with the
// time left for "{}". At zero the page loads again and the server says what is now true (open,
// sold out, ended). [data-poll] (the product page): its drop state is asked again every few
// seconds while the tab is visible, so an early "End sale now" or a moved window flips it too.
(function () {
  var start = performance.now(), reloading = false;
  function two(n) { return (n < 10 ? "0" : "") + n; }
  function left(ms) {
    var s = Math.ceil(ms / 1000), d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    return (d ? d + " d " : "") + (d || h ? h + ":" + two(m) : m) + ":" + two(s % 60);
  }
  function reload() {
    if (reloading) { return; }
    reloading = true;  // at most once a second: a page drawn right at its edge does not spin
    setTimeout(function () { location.replace(location.pathname + location.search); },
      Math.max(0, 1000 - (performance.now() - start)));
  }
  document.querySelectorAll("[data-flip-at]").forEach(function (el) {
    var until = new Date(el.dataset.flipAt) - new Date(el.dataset.serverNow);
    if (isNaN(until)) { return; }
    (function tick() {
      var ms = until - (performance.now() - start);
      if (ms <= 0) { el.textContent = el.dataset.flipping || ""; reload(); return; }
      el.textContent = el.dataset.countdown.replace("{}", left(ms));
      setTimeout(tick, ms % 1000 || 1000);
    })();
  });
  var poll = document.querySelector("[data-poll]");
  if (poll) {
    var every = 1000 * (Number(poll.dataset.pollEvery) || 5);
    setInterval(function () {
      if (document.hidden || reloading) { return; }
      fetch(poll.dataset.poll, {headers: {Accept: "application/json"}, cache: "no-store"})
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (s) { if (s && s.key !== poll.dataset.key) { reload(); } })
        .catch(function () {});  // busy or offline: ask again next time
    }, every + Math.random() * 1000);
  }
})();
