// qbridge console: live updates without a page reload. Every element with
// data-refresh="<url>" is replaced by a fresh copy of itself, fetched from
// that URL every 5 seconds, while the page is visible. The server renders the
// fragment, escaped as the page is; this script only swaps it in, and only an
// element with the same id (a signed-out answer is the login page: then it
// says so and stops).
(function () {
  "use strict";
  function refresh() {
    if (document.hidden) return;
    document.querySelectorAll("[data-refresh]").forEach(function (el) {
      fetch(el.getAttribute("data-refresh"), {
        credentials: "same-origin",
        redirect: "manual",
        headers: { "X-Qbridge-Refresh": "1" }
      })
        .then(function (r) {
          if (r.ok && r.type !== "opaqueredirect") return r.text();
          if (r.type === "opaqueredirect" || r.status === 403) signedOut(el);
          return null;
        })
        .then(function (html) {
          if (html === null) return;
          var box = document.createElement("div");
          box.innerHTML = html;
          var fresh = box.firstElementChild;
          if (fresh && fresh.id === el.id) el.replaceWith(fresh);
        })
        .catch(function () {});
    });
  }
  function signedOut(el) {
    el.removeAttribute("data-refresh");
    var note = document.createElement("p");
    note.className = "error";
    note.textContent = "Your session ended: reload the page to log in again.";
    el.before(note);
  }
  setInterval(refresh, 5000);
})();
