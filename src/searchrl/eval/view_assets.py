"""The inline CSS and JavaScript of the trajectory viewer page (`searchrl.eval.view`).

Kept apart so view.py reads as data -> HTML. Both are static: no model output ever goes in here,
and the page loads nothing from the network (it must open offline, from a run directory).
"""

CSS = """
:root { --fg:#1d2330; --muted:#667085; --line:#d8dde6; --bg:#f6f7f9; --card:#fff;
  --ok:#1a7f37; --bad:#c62828; --na:#8a8f98; --env:#eef3fb; --envline:#7b9acc; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color:var(--fg);
  background:var(--bg); }
header { padding:16px 24px 8px; background:#fff; border-bottom:1px solid var(--line);
  position:sticky; top:0; z-index:2; }
h1 { font-size:18px; margin:0 0 2px; word-break:break-all; }
.sub { color:var(--muted); margin:0 0 8px; }
table.metrics { border-collapse:collapse; margin:4px 0 8px; font-size:13px; }
p.summary { margin:4px 0; font-size:15px; } p.summary b { font-weight:600; color:var(--muted); }
details.all-metrics summary { color:var(--muted); font-size:12px; cursor:pointer; }
details.prompt pre { white-space:pre-wrap; font-size:12px; background:var(--bg); padding:6px; }
table.metrics th, table.metrics td { border:1px solid var(--line); padding:2px 8px; }
table.metrics th { background:var(--bg); font-weight:600; text-align:left; }
table.metrics td { font-variant-numeric:tabular-nums; text-align:right; }
table.metrics td.nonfinite { color:var(--bad); font-weight:600; }
.controls { display:flex; gap:16px; align-items:center; flex-wrap:wrap; }
.controls input[type=search] { width:320px; padding:4px 8px; border:1px solid var(--line);
  border-radius:4px; }
#shown { color:var(--muted); }
main { padding:16px 24px; display:flex; flex-direction:column; gap:14px; }
article.card { background:var(--card); border:1px solid var(--line); border-radius:6px;
  padding:12px 16px; }
article.card[hidden] { display:none; }
.card-head { display:flex; gap:8px; align-items:center; flex-wrap:wrap; font-size:12px; }
.idx { font-weight:700; }
.qid { color:var(--muted); font-family:ui-monospace, monospace; }
.badge, .pill { border-radius:10px; padding:1px 8px; font-size:12px; }
.badge { color:#fff; font-weight:600; }
.badge.ok { background:var(--ok); } .badge.bad { background:var(--bad); }
.badge.na { background:var(--na); }
.pill { background:var(--bg); border:1px solid var(--line); }
.pill.fmt-bad { border-color:var(--bad); color:var(--bad); }
h2.question { font-size:15px; margin:8px 0 6px; }
dl.facts { display:grid; grid-template-columns:max-content 1fr; gap:2px 12px; margin:0 0 8px; }
dl.facts dt { color:var(--muted); } dl.facts dd { margin:0; }
.prediction { font-weight:600; }
.response { white-space:pre-wrap; word-wrap:break-word; font-family:ui-monospace, monospace;
  font-size:12.5px; background:#fcfcfd; border:1px solid var(--line); border-radius:4px;
  padding:8px 10px; }
.tag { border-radius:3px; padding:0 2px; font-weight:700; }
.tag-query { background:#ffe08a; color:#6b4b00; }
.tag-think { background:#e4ddf7; color:#4b3a8c; }
.tag-answer { background:#c9efd2; color:#145c2a; }
.tag-docs { background:#d3e0f5; color:#1f4477; }
.r-query { background:#fff3c4; outline:1px solid #f0c94c; }
.r-think { color:#4a4f5c; }
.r-answer { background:#e3f7e8; font-weight:700; }
.env { display:block; white-space:normal; margin:6px 0; border:2px dashed var(--envline);
  background:var(--env); border-radius:4px; }
.env-label { display:block; font-family:system-ui, sans-serif; font-size:11px; color:#1f4477;
  background:#d3e0f5; padding:2px 8px; text-transform:uppercase; letter-spacing:.04em; }
.env-ids { text-transform:none; letter-spacing:0; font-family:ui-monospace, monospace; }
.env-text { display:block; white-space:pre-wrap; padding:4px 8px; color:#33415c; }
ol.searches { margin:8px 0 0; padding-left:22px; font-size:13px; }
ol.searches .query { background:#fff3c4; padding:0 3px; }
ol.searches code { font-size:12px; background:var(--bg); padding:0 3px; margin-right:4px; }
.empty { color:var(--muted); font-style:italic; }
"""

# Filters run on load from the URL (?q=text&incorrect=1&searches=1, or the same after #) so a
# filtered view can be linked, and so headless tests can check them. `data-js` proves the page's
# own script ran.
JS = """
(function () {
  var body = document.body;
  var cards = Array.prototype.slice.call(document.querySelectorAll('article.card'));
  var box = document.getElementById('filter');
  var onlyBad = document.getElementById('only-incorrect');
  var onlySearch = document.getElementById('only-searches');
  var shown = document.getElementById('shown');
  var texts = cards.map(function (c) { return c.textContent.toLowerCase(); });
  function apply() {
    var needle = box.value.trim().toLowerCase();
    var n = 0;
    cards.forEach(function (c, i) {
      var show = (!needle || texts[i].indexOf(needle) >= 0)
        && (!onlyBad.checked || c.dataset.correct === '0')
        && (!onlySearch.checked || Number(c.dataset.searches) > 0);
      c.hidden = !show;
      if (show) { n += 1; }
    });
    shown.textContent = n + ' of ' + cards.length + ' shown';
  }
  var raw = location.search ? location.search.slice(1) : location.hash.replace(/^#/, '');
  var params = new URLSearchParams(raw);
  if (params.has('q')) { box.value = params.get('q'); }
  onlyBad.checked = params.get('incorrect') === '1';
  onlySearch.checked = params.get('searches') === '1';
  box.addEventListener('input', apply);
  onlyBad.addEventListener('change', apply);
  onlySearch.addEventListener('change', apply);
  apply();
  body.setAttribute('data-js', 'ready');
})();
"""
