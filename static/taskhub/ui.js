// Small page behaviours with no inline script: copy buttons.
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
})();
