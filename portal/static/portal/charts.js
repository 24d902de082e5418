// Cost charts: each [data-figure] element is drawn from the figure JSON (json_script) whose id
// it names, with the plotly.js the portal serves from the installed plotly package. The
// figures are built on the server (portal/charts.py); the tables beside them have the same
// numbers, so a page without this script still has every figure.
(function () {
  "use strict";

  function draw(root) {
    if (!window.Plotly) return;
    root.querySelectorAll("[data-figure]").forEach(function (node) {
      var source = document.getElementById(node.getAttribute("data-figure"));
      if (!source || node.getAttribute("data-drawn") === "1") return;
      var figure = JSON.parse(source.textContent);
      window.Plotly.newPlot(node, figure.data, figure.layout, {
        responsive: true,
        displaylogo: false,
        modeBarButtonsToRemove: ["sendDataToCloud"],
      });
      node.setAttribute("data-drawn", "1");
    });
  }

  document.addEventListener("DOMContentLoaded", function () { draw(document); });
  // The costs page swaps its body with HTMX when another month is chosen.
  document.addEventListener("htmx:afterSettle", function (event) { draw(event.target); });
})();
