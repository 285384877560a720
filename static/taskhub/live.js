// The live-connection dot, and what a page needs after its socket (re)opens.
// The socket itself is htmx's ws extension (ws-connect on #live-indicator in base.html).
(function () {
  "use strict";

  // Closes the ws extension retries by itself; others (e.g. 1001 when the server restarts) are retried here.
  var RETRIED_BY_EXTENSION = [1006, 1011, 1012, 1013];
  // The server refused: not signed in (4401) or no longer allowed (4403). Retrying would not help.
  var REFUSED = [4401, 4403];
  var openedBefore = false;
  var retryTimer = null;
  var retries = 0;

  function indicator() {
    return document.getElementById("live-indicator");
  }

  // The words come from the indicator's data-label-* (base.html: translated); these English ones are the fallback.
  function word(key, fallback) {
    var element = indicator();
    return (element && element.getAttribute("data-label-" + key)) || fallback;
  }

  function show(state, label) {
    var element = indicator();
    if (!element) return;
    element.dataset.state = state;
    var text = element.querySelector(".live-label");
    if (text) text.textContent = label;
  }

  function watchTasks(socketWrapper) {
    // A page that shows one task marks it with data-live-watch="<task uuid>"; each new socket asks again.
    document.querySelectorAll("[data-live-watch]").forEach(function (element) {
      socketWrapper.send(JSON.stringify({ watch: element.dataset.liveWatch }));
    });
  }

  document.addEventListener("htmx:wsConnecting", function () {
    show("reconnecting", openedBefore ? word("reconnecting", "reconnecting…") : word("connecting", "connecting…"));
  });

  document.addEventListener("htmx:wsOpen", function (event) {
    retries = 0;
    show("live", word("live", "live"));
    watchTasks(event.detail.socketWrapper);
    if (openedBefore) {
      // Messages sent while the socket was closed are lost: pages listen for this to reload their parts
      // (hx-trigger="taskhub:live-resync from:body"). The nav counts arrive from the server on connect.
      document.body.dispatchEvent(new CustomEvent("taskhub:live-resync", { bubbles: true }));
    }
    openedBefore = true;
  });

  // Pushed elements that replace what a page shows, where it shows them (a closed card on the inbox and on the task
  // page) come in <template hx-swap-oob="none:body" data-live-replace>: every page has its target, body, so a page
  // that does not show them reports no missing target, and the swap style none leaves the rest to this.
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var signal = event.detail && event.detail.fragment;
    if (!signal || !signal.content || !signal.hasAttribute("data-live-replace")) return;
    Array.prototype.forEach.call(signal.content.children, function (element) {
      var shown = element.id && document.getElementById(element.id);
      if (!shown) return;
      var fresh = document.importNode(element, true);
      keepOrdinal(shown, fresh);
      replaceKeepingControl(shown, fresh);
      if (window.htmx) window.htmx.process(fresh);
    });
  });

  // An element swapped out of band while the focus is in it (a section of the task page at every change, a nav count)
  // would drop the focus to the page's body: the same element in the new one takes it back, or, gone with the change
  // (the header's "Cancel task…" once the task ended), the new element itself (issue 35 item 3).
  var focusBeforeSwap = null;
  var FOCUSABLE = "a[href], button, input, select, textarea, summary, [tabindex]";

  function focusables(within) {
    return Array.prototype.slice.call(within.querySelectorAll(FOCUSABLE));
  }

  function sameControl(element, key) {
    return element.tagName === key.tag && element.getAttribute("href") === key.href &&
      element.getAttribute("name") === key.name && element.getAttribute("value") === key.value;
  }

  // What names the focused control inside `container` (null: the focus is not there), to find it again in its
  // replacement (focusAgain).
  function focusKey(container) {
    var active = document.activeElement;
    if (!active || active === document.body || !container.contains(active)) return null;
    return {
      id: active.id,
      tag: active.tagName,
      href: active.getAttribute("href"),
      name: active.getAttribute("name"),
      value: active.getAttribute("value"),
      index: focusables(container).indexOf(active),
    };
  }

  function focusAgain(fresh, key) {
    var again = key.id ? document.getElementById(key.id) : null;
    if (!again || !fresh.contains(again)) {
      var all = focusables(fresh);
      var same = all.filter(function (element) { return sameControl(element, key); });
      again = same.length === 1 ? same[0] : (all[key.index] && sameControl(all[key.index], key) ? all[key.index] : same[0]);
    }
    if (!again) {
      if (!fresh.hasAttribute("tabindex")) fresh.setAttribute("tabindex", "-1");
      again = fresh;
    }
    again.focus({ preventScroll: true });
  }

  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var target = event.detail && event.detail.target;
    focusBeforeSwap = null;
    var key = target && target.id ? focusKey(target) : null;
    if (key) {
      key.container = target.id;
      focusBeforeSwap = key;
    }
  });

  document.addEventListener("htmx:oobAfterSwap", function () {
    var key = focusBeforeSwap;
    focusBeforeSwap = null;
    if (!key || (document.activeElement && document.activeElement !== document.body)) return;
    var fresh = document.getElementById(key.container);
    if (fresh) focusAgain(fresh, key);
  });

  // The same for an element replaced whole: a card pushed live (closed, or "delivered ✓" a moment after its answer),
  // and what the inbox's script re-fetches (its cards, pager and groups). `place`, if given, puts the new one where it
  // goes once it has replaced the old.
  function replaceKeepingControl(shown, fresh, place) {
    var key = focusKey(shown);
    shown.replaceWith(fresh);
    if (place) place();
    if (key) focusAgain(fresh, key);
  }
  window.taskhubReplaceKeepingControl = replaceKeepingControl;

  // "request 2 of 3" numbers the cards of one task that the page shows together; a card rendered alone to replace
  // one of them (closed live, or answered through htmx) cannot know its siblings, so it keeps the number shown.
  function keepOrdinal(shown, fresh) {
    var before = shown.querySelector(".ir-ordinal-slot");
    var after = fresh.querySelector && fresh.querySelector(".ir-ordinal-slot");
    if (before && after && !after.children.length && before.children.length) after.innerHTML = before.innerHTML;
  }
  window.taskhubKeepOrdinal = keepOrdinal;
  var ordinals = {};
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail && event.detail.target;
    if (target && target.id && target.classList && target.classList.contains("ir-card")) {
      ordinals[target.id] = target.cloneNode(true);
    }
  });
  document.addEventListener("htmx:afterSwap", function (event) {
    var target = event.detail && event.detail.target;
    if (!target || !target.id || !ordinals[target.id]) return;
    var swapped = document.getElementById(target.id);
    if (swapped) keepOrdinal(ordinals[target.id], swapped);
    delete ordinals[target.id];
  });

  // A card htmx swapped in place (an answer on the inbox or the task page, or a refusal with errors) keeps the focus
  // that was in the form it replaced: on the first field in error, else on the card (tabindex -1).
  document.addEventListener("htmx:afterSwap", function (event) {
    var card = event.detail && event.detail.target;
    if (!card || !card.id) return;
    var swapped = document.getElementById(card.id);
    if (swapped && swapped.classList.contains("ir-card")) {
      var error = swapped.querySelector("[aria-invalid=true], .has-error input, .has-error select");
      (error || swapped).focus();
    }
  });

  document.addEventListener("htmx:wsClose", function (event) {
    var code = event.detail && event.detail.event ? event.detail.event.code : 1006;
    if (REFUSED.indexOf(code) >= 0) {
      show("offline", word("offline", "not live"));
      return;
    }
    show("reconnecting", word("reconnecting", "reconnecting…"));
    if (RETRIED_BY_EXTENSION.indexOf(code) < 0 && retryTimer === null && event.detail.socketWrapper) {
      var delay = Math.min(1000 * Math.pow(2, retries), 30000);
      retries += 1;
      retryTimer = setTimeout(function () {
        retryTimer = null;
        event.detail.socketWrapper.reconnect();
      }, delay);
    }
  });
})();
