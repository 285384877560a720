// The waiting count in the tab title ("(3) Inbox · taskhub") and, for those who ask for it, a desktop notification
// when a request for them arrives. Both follow the nav's open-request count (templates/live/nav_counts.html), which
// the live socket pushes to every page; the server writes the title's first count itself (base.html).
(function () {
  "use strict";

  var KEY = "taskhub.notify";
  var PREFIX = /^\(\d+\)\s+/;
  var baseTitle = document.title.replace(PREFIX, "");
  var lastCount = null;

  function badge() {
    return document.getElementById("nav-inbox-count");
  }

  // The open requests this user may answer, or null when they approve for nothing.
  function waiting() {
    var element = badge();
    if (!element || element.dataset.approver !== "yes") return null;
    var count = parseInt(element.textContent, 10);
    return isNaN(count) ? null : count;
  }

  function showTitle(count) {
    document.title = (count ? "(" + count + ") " : "") + baseTitle;
  }

  function supported() {
    return "Notification" in window;
  }

  function optedIn() {
    try {
      return window.localStorage.getItem(KEY) === "on";
    } catch (error) {
      return false;
    }
  }

  function remember(on) {
    try {
      if (on) window.localStorage.setItem(KEY, "on");
      else window.localStorage.removeItem(KEY);
    } catch (error) {
      // Storage refused (private mode): the choice lasts for this page only.
    }
  }

  // Chromium answers Notification.permission with a synchronous call to its browser process: it is read once per
  // update, and an update runs once per socket message (queueUpdate), not once per element the message swaps.
  function permission() {
    return supported() ? window.Notification.permission : "denied";
  }

  function notifying(granted) {
    return granted === "granted" && optedIn();
  }

  function showButton(granted) {
    var button = document.querySelector("[data-notify-me]");
    if (!button) return;
    // Offered to approvers whose browser can notify and has not been told never to.
    button.hidden = !(supported() && waiting() !== null && granted !== "denied");
    var on = notifying(granted);
    button.setAttribute("aria-pressed", on ? "true" : "false");
    button.textContent = on ? taskhubWord("notify_on", "Notifications on") : taskhubWord("notify_me", "Notify me");
    button.title = on
      ? taskhubWord("notify_on_title", "A desktop notification tells you when a request waits for you. Click to stop them.")
      : taskhubWord("notify_me_title", "Get a desktop notification when a request waits for you.");
  }

  function inboxHref() {
    var link = document.querySelector("#nav-inbox a");
    return link ? link.href : "/inbox/";
  }

  function notify(count, added) {
    var text = added === 1 ? "A new request waits for you." : added + " new requests wait for you.";
    var notice;
    try {
      notice = new window.Notification("taskhub inbox", {
        body: text + " " + count + " open in all.",
        tag: "taskhub-inbox", // one notice however many tabs are open: each replaces the last
      });
    } catch (error) {
      return; // browsers that notify only from a service worker (Chrome on Android): the title still counts
    }
    notice.onclick = function () {
      window.focus();
      window.location.href = inboxHref();
      notice.close();
    };
  }

  function update() {
    var count = waiting();
    var granted = permission();
    showTitle(count);
    if (count !== null && lastCount !== null && count > lastCount && notifying(granted)) {
      notify(count, count - lastCount);
    }
    if (count !== null) lastCount = count;
    showButton(granted);
  }

  // A socket message swaps many elements out of band: the count is read once after them all.
  var updateQueued = false;
  function queueUpdate() {
    if (updateQueued) return;
    updateQueued = true;
    window.queueMicrotask(function () {
      updateQueued = false;
      update();
    });
  }

  // Permission is asked for only here, after a click on "Notify me", never on page load.
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-notify-me]");
    if (!button || !supported()) return;
    var granted = permission();
    if (notifying(granted)) {
      remember(false);
      showButton(granted);
      return;
    }
    window.Notification.requestPermission().then(function (answer) {
      remember(answer === "granted");
      showButton(answer);
    });
  });

  // After any pushed swap (a socket message, or a response carrying the nav counts out of band), and after each
  // socket message as a whole: reading the count twice changes nothing.
  document.addEventListener("htmx:oobAfterSwap", queueUpdate);
  document.addEventListener("htmx:wsAfterMessage", queueUpdate);

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", update);
  else update();
})();
