/* ckpt ui, the diff page: the "hide unchanged tensors" toggle (a class on the table; CSS hides the rows). */
(function () {
  "use strict";
  const toggle = document.getElementById("hide-unchanged");
  const table = document.getElementById("diff");
  if (!toggle || !table) return;
  function apply() {
    table.classList.toggle("hide-unchanged", toggle.checked);
  }
  toggle.addEventListener("change", apply);
  apply();
})();
