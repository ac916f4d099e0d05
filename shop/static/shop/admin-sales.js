/* The Sales view refreshes its figures while a sale runs: every few seconds (data-every) it fetches
   the same page and swaps in the new results, totals and "Updated" time, unless paused or in a
   background tab. Pause is kept for the tab (sessionStorage); "Refresh now" works without this
   script too (a plain link). */
function startSalesRefresh() {
  "use strict";
  const box = document.getElementById("sales-refresh");
  if (!box) return;
  const every = Math.max(1, Number(box.dataset.every) || 5) * 1000;
  const pause = box.querySelector("[data-action=pause]");
  const now = box.querySelector("[data-action=refresh]");
  const state = box.querySelector(".sales-state");
  const updated = document.getElementById("sales-updated");
  let paused = sessionStorage.getItem("sales-paused") === "1";
  let timer = null;

  function show(problem) {
    pause.textContent = paused ? "Resume" : "Pause";
    pause.setAttribute("aria-pressed", String(paused));
    box.classList.toggle("failed", Boolean(problem));
    state.textContent = problem || (paused ? "paused" : `refreshed every ${every / 1000} s`);
  }

  async function refresh() {
    try {
      const response = await fetch(window.location.href, {credentials: "same-origin"});
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const live = page.getElementById("sales-live");
      const stamp = page.getElementById("sales-updated");
      if (!live || !stamp) throw new Error("signed out?");
      document.getElementById("sales-live").replaceWith(document.importNode(live, true));
      updated.innerHTML = stamp.innerHTML;
      show();
    } catch (error) {
      show(`could not refresh (${error.message}); retrying`);
    }
  }

  function schedule() {
    clearTimeout(timer);
    if (paused) return;
    timer = setTimeout(async () => {
      if (!document.hidden) await refresh();  // a tab in the background costs the database nothing
      schedule();
    }, every);
  }

  pause.hidden = false;
  pause.addEventListener("click", () => {
    paused = !paused;
    sessionStorage.setItem("sales-paused", paused ? "1" : "0");
    show();
    schedule();
  });
  now.addEventListener("click", async (event) => {
    event.preventDefault();
    await refresh();
    schedule();
  });
  show();
  schedule();
}

if (document.readyState === "loading") {  // the admin loads its media in the page's head
  document.addEventListener("DOMContentLoaded", startSalesRefresh);
} else {
  startSalesRefresh();
}
