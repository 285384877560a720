(function () {
  // The words taskhub's scripts write, in the person's language (base.html's #taskhub-words; English if absent).
  var words = null;
  window.taskhubWord = function (key, fallback, number) {
    if (words === null) {
      var block = document.getElementById("taskhub-words");
      try {
        words = block ? JSON.parse(block.textContent) : {};
      } catch (error) {
        words = {};
      }
    }
    var text = words[key] || fallback;
    return number === undefined ? text : text.replace("%s", String(number));
  };
})();
// Small page behaviours with no inline script: copy buttons; the Inbox link for a user who became an approver.
(function () {
  "use strict";

  document.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-copy]");
    if (!button || !navigator.clipboard) return;
    navigator.clipboard.writeText(button.dataset.copy).then(function () {
      var label = button.textContent;
      button.textContent = taskhubWord("copied", "copied");
      setTimeout(function () { button.textContent = label; }, 1200);
    });
  });

  // The nav's <details> menu is a menu only on narrow screens (taskhub.css): open on wide ones, closed when the
  // screen narrows, and closed again by Escape or a click outside it.
  var menu = document.querySelector("details.navmenu");
  if (menu) {
    var wide = window.matchMedia("(min-width: 60.01rem)");
    var fit = function () { menu.open = wide.matches; };
    fit();
    wide.addEventListener("change", fit);
    document.addEventListener("keydown", function (event) {
      if (event.key === "Escape" && menu.open && !wide.matches) {
        menu.open = false;
        menu.querySelector("summary").focus();
      }
    });
    document.addEventListener("click", function (event) {
      if (menu.open && !wide.matches && !menu.contains(event.target)) menu.open = false;
    });
  }

  // The socket pushes the nav's open-request count to every page; the Inbox item of someone who was not an
  // approver when the page loaded is there but hidden, and shows once the count says they now are one.
  document.addEventListener("htmx:oobAfterSwap", function (event) {
    var badge = document.getElementById("nav-inbox-count");
    if (badge && badge.dataset.approver === "yes") {
      var item = badge.closest("li");
      if (item) item.hidden = false;
    }
  });
})();

// Times: "3 min ago" (the default) or the exact UTC time, everywhere, by a toggle ([data-time-toggle]) remembered
// in this browser. A <time> keeps the other form in its title; live swaps are re-applied after they settle.
(function () {
  "use strict";

  var KEY = "taskhub.times";

  function exact() {
    try {
      return window.localStorage.getItem(KEY) === "exact";
    } catch (error) {
      return false;
    }
  }

  function apply(root) {
    var useExact = exact();
    (root || document).querySelectorAll("time[datetime][title]").forEach(function (time) {
      if (time.dataset.relative === undefined) time.dataset.relative = time.textContent;
      if (time.dataset.exact === undefined) time.dataset.exact = time.getAttribute("title");
      time.textContent = useExact ? time.dataset.exact : time.dataset.relative;
      time.setAttribute("title", useExact ? time.dataset.relative : time.dataset.exact);
    });
    document.querySelectorAll("[data-time-toggle]").forEach(function (button) {
      button.setAttribute("aria-pressed", useExact ? "true" : "false");
      button.textContent = useExact ? taskhubWord("relative_times", "Relative times") : taskhubWord("exact_times", "Exact times");
    });
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-time-toggle]");
    if (!button) return;
    try {
      window.localStorage.setItem(KEY, exact() ? "relative" : "exact");
    } catch (error) {
      return;
    }
    apply(document);
  });

  document.addEventListener("htmx:afterSettle", function (event) {
    apply(event.target);
  });
  // A socket message swaps many elements out of band: the times are applied once after them all, not per swap
  // (the replaced element is out of the page by then, so its parent is often not there to narrow the walk).
  var applyQueued = false;
  document.addEventListener("htmx:oobAfterSwap", function () {
    if (applyQueued) return;
    applyQueued = true;
    window.queueMicrotask(function () {
      applyQueued = false;
      apply(document);
    });
  });
  document.addEventListener("DOMContentLoaded", function () {
    apply(document);
  });
})();
