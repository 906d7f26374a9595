// qbridge console: live updates without a page reload. Every element with
// data-refresh="<url>" is replaced by a fresh copy of itself, fetched from
// that URL every 5 seconds, while the page is visible. The server renders the
// fragment, escaped as the page is; this script only swaps it in.
(function () {
  "use strict";
  function refresh() {
    if (document.hidden) return;
    document.querySelectorAll("[data-refresh]").forEach(function (el) {
      fetch(el.getAttribute("data-refresh"), { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (html === null) return;
          var box = document.createElement("div");
          box.innerHTML = html;
          var fresh = box.firstElementChild;
          if (fresh) el.replaceWith(fresh);
        })
        .catch(function () {});
    });
  }
  setInterval(refresh, 5000);
})();
