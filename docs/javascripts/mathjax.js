// MathJax for pymdownx.arithmatex (generic mode): typeset only the `arithmatex` spans and the
// notebooks' rendered Markdown cells, and again after every page change of mkdocs-material.
window.MathJax = {
  tex: {
    // arithmatex writes \( \) and \[ \]; the notebooks' Markdown cells keep $ and $$.
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex|jp-RenderedMarkdown",
  },
};

document$.subscribe(() => {
  MathJax.startup.output.clearCache();
  MathJax.typesetClear();
  MathJax.texReset();
  MathJax.typesetPromise();
});
