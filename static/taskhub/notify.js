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

  function notifying() {
    return supported() && optedIn() && window.Notification.permission === "granted";
  }

  function showButton() {
    var button = document.querySelector("[data-notify-me]");
    if (!button) return;
    // Offered to approvers whose browser can notify and has not been told never to.
    var offered = supported() && waiting() !== null && window.Notification.permission !== "denied";
    button.hidden = !offered;
    var on = notifying();
    button.setAttribute("aria-pressed", on ? "true" : "false");
    button.textContent = on ? "Notifications on" : "Notify me";
    button.title = on
      ? "A desktop notification tells you when a request waits for you. Click to stop them."
      : "Get a desktop notification when a request waits for you.";
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
    showTitle(count);
    if (count !== null && lastCount !== null && count > lastCount && notifying()) notify(count, count - lastCount);
    if (count !== null) lastCount = count;
    showButton();
  }

  // Permission is asked for only here, after a click on "Notify me", never on page load.
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-notify-me]");
    if (!button || !supported()) return;
    if (notifying()) {
      remember(false);
      showButton();
      return;
    }
    window.Notification.requestPermission().then(function (permission) {
      remember(permission === "granted");
      showButton();
    });
  });

  // After any pushed swap, and after each socket message as a whole: reading the count twice changes nothing.
  document.addEventListener("htmx:oobAfterSwap", update);
  document.addEventListener("htmx:wsAfterMessage", update);

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", update);
  else update();
})();
