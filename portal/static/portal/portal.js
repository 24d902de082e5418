// Gantry portal: small progressive enhancements; every page works without them.
(function () {
  "use strict";

  // Confirm destructive buttons (data-confirm="...").
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-confirm]");
    if (button && !window.confirm(button.getAttribute("data-confirm"))) {
      event.preventDefault();
    }
  });

  function readJson(id) {
    var node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : {};
  }

  // Job form: defaults per job type, inference-only fields, the team's default priority.
  // Run on load and again on the form the Quote button's answer swaps in (once per form).
  function setupJobForm(form) {
    if (form.dataset.enhanced) return;
    form.dataset.enhanced = "true";
    var typeDefaults = readJson("type-defaults");
    var priorityDefaults = readJson("priority-defaults");
    var type = form.elements["job_type"];
    var project = form.elements["project"];
    var priority = form.elements["priority_class"];

    function showTypeFields() {
      form.querySelectorAll("[data-only-type]").forEach(function (field) {
        field.hidden = field.getAttribute("data-only-type") !== type.value;
      });
    }
    function showPriorityHint() {
      var byType = priorityDefaults[project.value] || {};
      var name = byType[type.value];
      priority.options[0].text = name ? "Team default for " + type.value + " (" + name + ")" : "Team default";
    }
    function applyDefaults() {
      var defaults = typeDefaults[type.value] || {};
      Object.keys(defaults).forEach(function (key) {
        var input = form.elements[key];
        if (!input) return;
        if (input.type === "checkbox") input.checked = Boolean(defaults[key]);
        else input.value = defaults[key];
      });
      if (type.value !== "inference") {
        form.elements["min_replicas"].value = "";
        form.elements["max_replicas"].value = "";
      }
    }
    type.addEventListener("change", function () { applyDefaults(); showTypeFields(); showPriorityHint(); });
    project.addEventListener("change", showPriorityHint);
    showTypeFields();
    showPriorityHint();
  }

  // A job's log pane shows its newest lines: it stays scrolled to the bottom as polls append,
  // unless the reader has scrolled up to read earlier lines.
  document.addEventListener("scroll", function (event) {
    var pane = event.target;
    if (pane.classList && pane.classList.contains("log")) {
      pane.dataset.pinned = String(pane.scrollTop + pane.clientHeight >= pane.scrollHeight - 8);
    }
  }, true);
  document.addEventListener("htmx:afterSettle", function () {
    var form = document.getElementById("job-form");
    if (form) setupJobForm(form);
    document.querySelectorAll(".log").forEach(function (pane) {
      if (pane.dataset.pinned !== "false") pane.scrollTop = pane.scrollHeight;
    });
  });

  document.addEventListener("DOMContentLoaded", function () {
    var form = document.getElementById("job-form");
    if (form) setupJobForm(form);
    // Filter bars apply as soon as a select or checkbox changes; the button stays for no-JS.
    // Only those that read (GET): a form that posts (an export) acts when its button is pressed.
    document.querySelectorAll("form.filters:not([method=post])").forEach(function (filters) {
      filters.addEventListener("change", function (event) {
        if (event.target.matches("select, input[type=checkbox], input[type=date]")) filters.submit();
      });
    });
  });
})();
