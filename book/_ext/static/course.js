/* Display formulas wider than the column scroll sideways. MathJax's Tab
   stop on every formula is off (inTabOrder: false in _config.yml), so a
   scrolling formula gets its own: without it a keyboard cannot scroll it
   (WCAG 2.1.1; axe rule scrollable-region-focusable). Re-checked when the
   window is resized. */
(function () {
  function mark() {
    document.querySelectorAll('mjx-container[display="true"]')
      .forEach(function (m) {
        if (m.scrollWidth > m.clientWidth + 1) m.setAttribute("tabindex", "0");
        else if (m.getAttribute("tabindex") === "0") m.removeAttribute("tabindex");
      });
  }
  document.addEventListener("DOMContentLoaded", function () {
    var mj = window.MathJax;
    if (!mj || !mj.startup || !mj.startup.promise) return;
    mj.startup.promise.then(mark);
    var timer;
    window.addEventListener("resize", function () {
      clearTimeout(timer);
      timer = setTimeout(mark, 200);
    });
  });
})();
