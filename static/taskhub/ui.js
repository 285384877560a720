// Small page behaviours with no inline script: copy buttons; the Inbox link for a user who became an approver.
(function () {
  "use strict";

  document.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-copy]");
    if (!button || !navigator.clipboard) return;
    navigator.clipboard.writeText(button.dataset.copy).then(function () {
      var label = button.textContent;
      button.textContent = "copied";
      setTimeout(function () { button.textContent = label; }, 1200);
    });
  });

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
