// The task pages: the live list (on a signal the changed row at once, then a re-fetch; highlight what changed,
// announce politely), clickable rows, and the detail page's re-sync after a reconnect. Loaded only by templates/tasks/*.
(function () {
  "use strict";

  var REFRESH_DELAY_MS = 300; // at most one re-fetch this often: changes that arrive together cost one request
  var ANNOUNCE_EVERY_MS = 4000; // screen readers hear at most one summary per few seconds
  var FRESH_CLASS = "is-fresh";
  var NEW_CLASS = "is-new";

  function results() {
    return document.getElementById("task-results");
  }

  // --- the list ----------------------------------------------------------------------------------------

  var versions = {}; // row id -> data-version (the task's updated_at) as last seen on this page
  var timer = null;
  var lastRefresh = 0;
  var inFlight = false;
  var again = false;
  var pending = { created: 0, changed: 0 };
  var lastAnnounced = 0;
  var announceTimer = null;

  function remember(container, mark) {
    var seen = {};
    var created = 0;
    var changed = 0;
    container.querySelectorAll("tr[id^='task-row-']").forEach(function (row) {
      var before = versions[row.id];
      var now = row.dataset.version;
      seen[row.id] = now;
      if (!mark) return;
      if (before === undefined) {
        row.classList.add(NEW_CLASS, FRESH_CLASS);
        created += 1;
      } else if (before !== now) {
        row.classList.add(FRESH_CLASS);
        changed += 1;
      }
    });
    versions = seen;
    return { created: created, changed: changed };
  }

  function announce(summary) {
    pending.created += summary.created;
    pending.changed += summary.changed;
    if (!pending.created && !pending.changed) return;
    var wait = Math.max(0, lastAnnounced + ANNOUNCE_EVERY_MS - Date.now());
    if (announceTimer !== null) return;
    announceTimer = setTimeout(function () {
      announceTimer = null;
      var region = document.getElementById("task-live-status");
      if (!region) return;
      var parts = [];
      if (pending.created) {
        parts.push(pending.created === 1 ? taskhubWord("tasks_new_one", "%s new task", 1) : taskhubWord("tasks_new_many", "%s new tasks", pending.created));
      }
      if (pending.changed) {
        parts.push(pending.changed === 1 ? taskhubWord("tasks_changed_one", "%s task changed", 1) : taskhubWord("tasks_changed_many", "%s tasks changed", pending.changed));
      }
      region.textContent = taskhubWord("tasks_updated", "Task list updated: %s.").replace("%s", parts.join(taskhubWord("list_separator", ", ")));
      pending = { created: 0, changed: 0 };
      lastAnnounced = Date.now();
    }, wait);
  }

  // The swap replaces what had the focus (a tab, a checkbox, a link in a row): the same element in the new list takes
  // it back, so a live update never moves a keyboard or screen reader user (issue 35 item 3).
  function focusedKey() {
    var element = document.activeElement;
    var section = results();
    if (!element || !section || !section.contains(element)) return null;
    if (element.id) return "#" + CSS.escape(element.id);
    if (element.dataset.tab) return "[data-tab='" + CSS.escape(element.dataset.tab) + "']";
    if (element.name && element.value) return "[name='" + CSS.escape(element.name) + "'][value='" + CSS.escape(element.value) + "']";
    if (element.getAttribute("href")) return "#task-results [href='" + CSS.escape(element.getAttribute("href")) + "']";
    return null;
  }

  function refocus(key) {
    if (!key || (document.activeElement && document.activeElement !== document.body)) return;
    var element = document.querySelector(key);
    if (element) element.focus({ preventScroll: true });
  }

  function refresh() {
    timer = null;
    lastRefresh = Date.now();
    if (!results()) return;
    if (inFlight) {
      again = true; // one more after this one, so the last change is never missed
      return;
    }
    inFlight = true;
    var focusKey = focusedKey();
    // The page's own URL: its filters, its tab, its page number.
    htmx
      .ajax("GET", window.location.pathname + window.location.search, {
        target: "#task-results",
        swap: "outerHTML",
      })
      .then(function () { refocus(focusKey); })
      .catch(function () {
        // The request failed (htmx logged it); the next signal or re-sync fetches again.
      })
      .finally(function () {
        inFlight = false;
        if (again) {
          again = false;
          schedule();
        }
      });
  }

  function schedule() {
    // The first change after a quiet spell is fetched at once (it used to wait the whole delay: bench/freshness.py);
    // those that follow within REFRESH_DELAY_MS of a fetch share the next one.
    if (timer === null) timer = setTimeout(refresh, Math.max(0, lastRefresh + REFRESH_DELAY_MS - Date.now()));
  }

  function showChangedRow(signal) {
    // The signal carries the changed task's row: where this page shows that task, the row is replaced at once.
    // The re-fetch that follows still decides what the page lists (filters, tabs, order, paging, counts).
    var row = signal.content && signal.content.querySelector("tr[id^='task-row-']");
    var shown = row && document.getElementById(row.id);
    if (!shown || !results().contains(shown)) return;
    // An ISO timestamp in one zone: a change heard late is not shown over a newer one.
    if ((shown.dataset.version || "") > (row.dataset.version || "")) return;
    var fresh = document.importNode(row, true);
    fresh.classList.add(FRESH_CLASS);
    // The signal's row has no tick box (it goes to everyone): the shown row's box moves over, ticked or not.
    var pick = shown.querySelector("td.task-pick");
    if (pick && !fresh.querySelector("td.task-pick")) fresh.insertBefore(pick, fresh.firstChild);
    shown.replaceWith(fresh);
  }

  // Ticked rows (for "Cancel ticked…") stay ticked when the live list is fetched again.
  var ticked = {};
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (box.matches && box.matches("td.task-pick input[name='ids']")) ticked[box.value] = box.checked;
  });
  function retick(container) {
    container.querySelectorAll("td.task-pick input[name='ids']").forEach(function (box) {
      if (ticked[box.value]) box.checked = true;
    });
  }
  document.addEventListener("htmx:afterSwap", function (event) {
    if (event.target && event.target.id === "task-results") retick(event.target);
  });
  // The table may be swapped at the very moment of the click: the form sends what was ticked, whatever is shown.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.matches || !form.matches("form#bulk-pick")) return;
    form.querySelectorAll("input[data-ticked]").forEach(function (input) { input.remove(); });
    var sent = {};
    Array.prototype.forEach.call(form.elements, function (field) {
      if (field.name === "ids" && field.checked) sent[field.value] = true;
    });
    Object.keys(ticked).forEach(function (id) {
      if (!ticked[id] || sent[id]) return;
      var input = document.createElement("input");
      input.type = "hidden";
      input.name = "ids";
      input.value = id;
      input.setAttribute("data-ticked", "");
      form.appendChild(input);
    });
  });

  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var fragment = event.detail && event.detail.fragment;
    if (fragment && fragment.id === "tasks-live-signal" && results()) {
      showChangedRow(fragment);
      schedule();
    }
  });

  document.addEventListener("htmx:afterSettle", function (event) {
    if (event.target && event.target.id === "task-results") {
      retick(event.target);
      announce(remember(event.target, true));
    }
  });

  document.addEventListener("taskhub:live-resync", function () {
    if (results()) schedule();
  });

  // A click anywhere on a row opens the task; the link in the row stays for keyboards and no-JS.
  document.addEventListener("click", function (event) {
    var row = event.target.closest("tr[data-href]");
    if (!row || event.target.closest("a, button, input, select, textarea")) return;
    if (window.getSelection && String(window.getSelection())) return; // selecting text is not a click
    if (event.metaKey || event.ctrlKey) {
      window.open(row.dataset.href, "_blank", "noopener");
    } else {
      window.location.assign(row.dataset.href);
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    var container = results();
    if (container) remember(container, false);
  });
})();

// The task page's answer cards. Live updates never replace the section (someone may be typing in a card):
// closed cards arrive by id, out of band; the requests signal lists the open ones, and cards this page does not
// show yet are fetched and added in order, leaving the others alone.
(function () {
  "use strict";

  function shownIds(list) {
    return Array.prototype.map.call(list.querySelectorAll(":scope > [data-request]"), function (card) {
      return card.dataset.request;
    });
  }

  function addMissingCards(signal) {
    var taskSection = signal.closest("section");
    if (!taskSection) return;
    var list = taskSection.querySelector(".request-cards");
    var open = (signal.dataset.open || "").split(" ").filter(Boolean);
    var count = taskSection.querySelector("[id$='-requests-count']");
    var none = taskSection.querySelector("[id$='-no-requests']");
    if (count) count.textContent = taskhubWord("requests_open", "%s open", open.length);
    if (!list) return;
    var shown = shownIds(list);
    var missing = open.filter(function (id) { return shown.indexOf(id) < 0; });
    if (!missing.length) return;
    fetch(signal.dataset.cardsUrl, { headers: { "HX-Request": "true" }, credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : ""; })
      .then(function (html) {
        if (!html) return;
        var fetched = new DOMParser().parseFromString(html, "text/html").querySelector(".request-cards");
        if (!fetched) return;
        var present = shownIds(list);
        Array.prototype.forEach.call(fetched.querySelectorAll(":scope > [data-request]"), function (card) {
          if (present.indexOf(card.dataset.request) >= 0) return;
          var imported = document.importNode(card, true);
          list.appendChild(imported);
          if (window.htmx) window.htmx.process(imported);
        });
        if (none) none.hidden = list.children.length > 0;
      });
  }

  document.addEventListener("htmx:oobAfterSwap", function (event) {
    var target = event.detail && event.detail.target;
    // The swapped-out element is detached by now: work on the new one, found by its id.
    if (target && target.id && /-requests-signal$/.test(target.id)) {
      var signal = document.getElementById(target.id);
      if (signal) addMissingCards(signal);
    }
  });
})();

// The task page says politely when its task ends (a screen reader reads nothing of a header swapped in place), in a
// live region outside what the socket replaces; the focus stays where it is.
(function () {
  "use strict";

  var ENDED = ["completed", "failed", "cancelled", "expired", "lost"];
  var shownStatus = null;

  function pill() {
    var page = document.querySelector(".task-detail[data-live-watch]");
    return page && document.querySelector("#task-" + CSS.escape(page.dataset.liveWatch) + "-header .task-title .pill");
  }

  document.addEventListener("DOMContentLoaded", function () {
    var shown = pill();
    if (shown) shownStatus = shown.dataset.status;
  });

  document.addEventListener("htmx:oobAfterSwap", function (event) {
    var target = event.detail && event.detail.target;
    if (!target || !/^task-.+-header$/.test(target.id || "")) return;
    var now = pill();
    var region = document.getElementById("task-end-status");
    if (!now || !region || now.dataset.status === shownStatus) return;
    var ended = ENDED.indexOf(now.dataset.status) >= 0 && ENDED.indexOf(shownStatus) < 0;
    shownStatus = now.dataset.status;
    if (ended) region.textContent = taskhubWord("task_ended", "The task ended: %s.", now.textContent.trim());
  });
})();

// The filter bar leaves its empty fields out of the URL, so a link names only the filters in force.
(function () {
  "use strict";

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.matches || !form.matches("form.task-filters")) return;
    Array.prototype.forEach.call(form.elements, function (field) {
      if (field.name && !field.disabled && field.type !== "checkbox" && field.value === "") field.disabled = true;
    });
  });

  // Back to the page from the bfcache: the fields left out last time are fields again.
  window.addEventListener("pageshow", function () {
    document.querySelectorAll("form.task-filters [name]:disabled").forEach(function (field) {
      field.disabled = false;
    });
  });
})();
