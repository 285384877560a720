// The signed-in home: when the live socket signals a changed task (the list's signal, tasks-live-signal, reaches
// every page of whoever may see that task), re-fetch the dashboard's counts; at most once per REFRESH_EVERY_MS.
(function () {
  "use strict";

  var REFRESH_EVERY_MS = 1000;
  var timer = null;
  var last = 0;

  function board() {
    return document.getElementById("dashboard");
  }

  function refresh() {
    timer = null;
    last = Date.now();
    var element = board();
    if (!element) return;
    htmx
      .ajax("GET", element.getAttribute("hx-get"), { target: "#dashboard", swap: "outerHTML" })
      .catch(function () {});
  }

  // The trends (#trends) follow live changes too, but at most every TRENDS_EVERY_MS: a week of charts need not be
  // redrawn for each task that changes (they also refresh every minute by themselves, hx-trigger).
  var TRENDS_EVERY_MS = 15000;
  var trendsTimer = null;
  var trendsLast = 0;

  function refreshTrends() {
    trendsTimer = null;
    trendsLast = Date.now();
    var element = document.getElementById("trends");
    if (!element) return;
    htmx
      .ajax("GET", element.getAttribute("hx-get"), { target: "#trends", swap: "outerHTML" })
      .catch(function () {});
  }

  function schedule() {
    if (trendsTimer === null && document.getElementById("trends")) {
      trendsTimer = setTimeout(refreshTrends, Math.max(0, trendsLast + TRENDS_EVERY_MS - Date.now()));
    }
    if (timer === null) timer = setTimeout(refresh, Math.max(0, last + REFRESH_EVERY_MS - Date.now()));
  }

  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var fragment = event.detail && event.detail.fragment;
    if (fragment && fragment.id === "tasks-live-signal" && board()) schedule();
  });
  document.addEventListener("taskhub:live-resync", function () {
    if (board()) schedule();
  });
  document.addEventListener("htmx:afterSettle", function (event) {
    if (event.target && event.target.id === "dashboard") {
      var region = document.getElementById("dashboard-live-status");
      if (region) region.textContent = taskhubWord("home_updated", "Home updated.");
    }
  });
})();
