// The inbox: keeps its list of cards current from the live socket, and the keyboard (j/k, Enter, Ctrl+Enter).
// Cards come from templates/tasks/input_request_card.html; without JavaScript the page still works by plain POSTs.
(function () {
  "use strict";

  var REFETCH_GAP_MS = 300; // at most one re-fetch per 300 ms, however many changes arrive (the first at once)
  var lastFetch = 0;
  var pending = null;
  var inFlight = false;

  function inbox() {
    return document.querySelector(".inbox[data-cards-url]");
  }

  function list() {
    return document.getElementById("inbox-cards");
  }

  function cards() {
    return Array.prototype.slice.call(document.querySelectorAll(".ir-card"));
  }

  function announce(text) {
    var region = document.getElementById("inbox-announce");
    if (region) region.textContent = text;
  }

  // --- re-fetching the list ----------------------------------------------------------------------------

  function scheduleRefetch() {
    if (!inbox()) return;
    var wait = Math.max(0, lastFetch + REFETCH_GAP_MS - Date.now());
    if (pending !== null) return;
    pending = setTimeout(function () {
      pending = null;
      refetch();
    }, wait);
  }

  function refetch() {
    var section = inbox();
    if (!section) return;
    if (inFlight) {
      scheduleRefetch();
      return;
    }
    inFlight = true;
    lastFetch = Date.now();
    var ids = cards().map(function (card) { return card.dataset.request; });
    // data-cards-url is this page's own filters and page number (the view writes it), so the list stays the one shown.
    var url = section.dataset.cardsUrl + "&include=" + encodeURIComponent(ids.join(","));
    fetch(url, { credentials: "same-origin", headers: { "HX-Request": "true" } })
      .then(function (response) {
        if (!response.ok) throw new Error("inbox re-fetch: HTTP " + response.status);
        return response.text();
      })
      .then(merge)
      .catch(function (error) { console.warn(error); })
      .then(function () { inFlight = false; });
  }

  // Cards already shown in the same state stay untouched (someone may be typing in them); new ones are added
  // in order, and those whose state changed are replaced.
  function merge(html) {
    var target = list();
    if (!target) return;
    var holder = document.createElement("template");
    holder.innerHTML = html;
    var fresh = holder.content.querySelectorAll(".ir-card");
    var added = 0;
    var previous = null;
    Array.prototype.forEach.call(fresh, function (card) {
      var current = document.getElementById(card.id);
      if (current && current.dataset.state === card.dataset.state) {
        previous = current;
        return;
      }
      if (current) {
        if (window.taskhubKeepOrdinal) window.taskhubKeepOrdinal(current, card);
        replaceKeepingControl(current, card);
      } else if (previous && previous.parentNode === target) {
        previous.after(card);
        added += 1;
      } else {
        target.prepend(card);
        added += 1;
      }
      if (window.htmx) window.htmx.process(card);
      previous = card;
    });
    if (fresh.length) {
      var empty = document.getElementById("inbox-empty");
      if (empty) empty.remove();
    }
    // "N more waiting" follows the list: keep it last and as the server counts it now.
    var more = holder.content.getElementById("inbox-more");
    var shownMore = document.getElementById("inbox-more");
    if (more && shownMore) {
      replaceKeepingControl(shownMore, more, function () { target.appendChild(more); });
    }
    // The flood groups, the hidden-requests line and the pager hold no input: they are replaced as counted now.
    ["inbox-groups", "inbox-pager"].forEach(function (id) {
      var now = holder.content.getElementById(id);
      var shown = document.getElementById(id);
      if (now && shown) replaceKeepingControl(shown, now);
    });
    mergeLikeGroups(holder.content.getElementById("inbox-like"));
    pruneLikeGroups();
    if (added) announce(added === 1 ? taskhubWord("inbox_new_one", "A new request arrived.") : taskhubWord("inbox_new_many", "%s new requests arrived.", added));
  }

  // A keyboard user's focus on one of their links ("Newer →", "show them") stays on the same link (static/taskhub/
  // live.js), not dropped to the page's body.
  function replaceKeepingControl(shown, fresh, place) {
    if (window.taskhubReplaceKeepingControl) window.taskhubReplaceKeepingControl(shown, fresh, place);
    else {
      shown.replaceWith(fresh);
      if (place) place();
    }
  }

  // The groups of like requests (templates/tasks/like_group.html) follow the list: a new group is added, a group
  // gone is removed, and a group whose requests changed gets the new list and count but keeps its form fields,
  // where someone may be typing (the ticks of requests still in it are kept too).
  function mergeLikeGroups(fresh) {
    var shown = document.getElementById("inbox-like");
    if (!fresh || !shown) return;
    var wanted = {};
    Array.prototype.forEach.call(fresh.querySelectorAll(".like-group"), function (group) {
      wanted[group.id] = true;
      var current = document.getElementById(group.id);
      if (!current) {
        shown.appendChild(group);
        if (window.htmx) window.htmx.process(group);
        return;
      }
      if (current.dataset.ids === group.dataset.ids) return;
      var unticked = {};
      current.querySelectorAll(".like-list input[name=request]").forEach(function (box) {
        if (!box.checked) unticked[box.value] = true;
      });
      var list = group.querySelector(".like-list");
      list.querySelectorAll("input[name=request]").forEach(function (box) {
        if (unticked[box.value]) box.checked = false;
      });
      current.querySelector(".like-list").replaceWith(list);
      current.querySelector(".like-count").textContent = group.querySelector(".like-count").textContent;
      current.dataset.ids = group.dataset.ids;
    });
    Array.prototype.forEach.call(shown.querySelectorAll(".like-group"), function (group) {
      if (!wanted[group.id]) group.remove();
    });
  }

  // A request answered on its own card (here or by a colleague, pushed live) leaves its group at once; a group left
  // with fewer than two goes, since its request still has its card.
  function pruneLikeGroups() {
    document.querySelectorAll(".like-group").forEach(function (group) {
      var ids = (group.dataset.ids || "").split(",").filter(function (id) {
        var card = document.getElementById("ir-" + id);
        if (card && card.dataset.state !== "open") {
          var box = group.querySelector(".like-list input[name=request][value='" + id + "']");
          var item = box ? box.closest("li") : null;
          if (item) item.remove();
          return false;
        }
        return id !== "";
      });
      if (ids.length < 2) {
        group.remove();
        return;
      }
      group.dataset.ids = ids.join(",");
      var count = group.querySelector(".like-count");
      if (count) count.textContent = String(ids.length);
    });
  }

  document.addEventListener("htmx:afterSwap", function () { pruneLikeGroups(); });
  document.addEventListener("htmx:oobAfterSwap", function () { window.setTimeout(pruneLikeGroups, 0); });
  document.addEventListener("htmx:wsAfterMessage", function () { pruneLikeGroups(); });

  // The signal the socket pushes when a task with requests changes (templates/tasks/inbox.html#live-signal):
  // with requests open, cards may be new. (live.js puts its closed cards in place.)
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var signal = event.detail && event.detail.fragment;
    if (signal && signal.id === "inbox-live-signal" && signal.hasAttribute("data-open-requests")) scheduleRefetch();
  });

  document.body.addEventListener("taskhub:live-resync", function () {
    scheduleRefetch();
  });

  // --- keyboard ----------------------------------------------------------------------------------------

  function typingIn(element) {
    if (!element) return false;
    var tag = element.tagName;
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || element.isContentEditable;
  }

  function focusCard(card) {
    if (!card) return;
    card.focus();
    card.scrollIntoView({ block: "nearest", behavior: "smooth" });
  }

  function move(step) {
    var all = cards();
    if (!all.length) return;
    var current = document.activeElement ? document.activeElement.closest(".ir-card") : null;
    var index = all.indexOf(current);
    if (index < 0) {
      focusCard(step > 0 ? all[0] : all[all.length - 1]);
      return;
    }
    focusCard(all[Math.min(all.length - 1, Math.max(0, index + step))]);
  }

  function firstField(card) {
    return card.querySelector(
      ".ir-form input:not([type=hidden]):not([disabled]), .ir-form select, .ir-form textarea, .ir-url-open, .ir-form button"
    );
  }

  document.addEventListener("keydown", function (event) {
    if (!inbox()) return;
    var active = document.activeElement;
    var card = active ? active.closest(".ir-card") : null;

    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      if (!card) return;
      var accept = card.querySelector("button[data-accept]");
      var form = card.querySelector("form.ir-form");
      if (accept && form) {
        event.preventDefault();
        accept.click();
      }
      return;
    }
    if (event.altKey || event.ctrlKey || event.metaKey || typingIn(active)) return;
    if (event.key === "j" || event.key === "k") {
      event.preventDefault();
      move(event.key === "j" ? 1 : -1);
    } else if (event.key === "Enter" && card && active === card) {
      var field = firstField(card);
      if (field) {
        event.preventDefault();
        field.focus();
      }
    }
  });

  // After htmx swaps a card in place, static/taskhub/live.js keeps the focus on it (the task page has cards too).
})();
