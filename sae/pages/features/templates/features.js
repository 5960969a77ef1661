(function () {
  'use strict';
  // Sorting (a click on a column's header) and filtering of the index, and, in the same order,
  // of the unit cards. Numbers come from the rows' data-* attributes; an empty value (the
  // selectivity of a dead or rare unit) sorts last in either direction.
  var tbody = document.querySelector('#index tbody');
  var grid = document.getElementById('units');
  var rows = Array.prototype.slice.call(tbody.rows);
  var cards = {};
  Array.prototype.forEach.call(grid.children, function (c) { cards[c.dataset.j] = c; });
  var ascendingFirst = { j: true, cls: true, st: true };
  var key = 'j', dir = 1;
  function num(row, k) {
    var v = row.dataset[k];
    return v === '' ? NaN : parseFloat(v);
  }
  // a filter the page leaves out (the class filters of data without labels) filters nothing
  function value(id) {
    var e = document.getElementById(id);
    return e ? e.value : '';
  }
  function field(id) {
    var v = value(id);
    return v === '' ? NaN : parseFloat(v);
  }
  function apply() {
    var state = value('f-state');
    var cls = value('f-class');
    var minFreq = field('f-freq') / 100, minSel = field('f-sel'), minMax = field('f-max');
    var order = rows.slice().sort(function (a, b) {
      var x = num(a, key), y = num(b, key);
      if (isNaN(x) !== isNaN(y)) { return isNaN(x) ? 1 : -1; }
      return (x === y || isNaN(x)) ? num(a, 'j') - num(b, 'j') : dir * (x - y);
    });
    var shown = 0;
    order.forEach(function (row) {
      var s = row.dataset.state, ok = true;
      if (state === 'live') { ok = s !== 'dead'; } else if (state) { ok = s === state; }
      if (ok && cls !== '') { ok = row.dataset.cls === cls; }
      if (ok && !isNaN(minFreq)) { ok = num(row, 'freq') >= minFreq; }
      if (ok && !isNaN(minSel)) { ok = num(row, 'sel') >= minSel; }
      if (ok && !isNaN(minMax)) { ok = num(row, 'max') >= minMax; }
      row.hidden = !ok;
      cards[row.dataset.j].hidden = !ok;
      tbody.appendChild(row);
      grid.appendChild(cards[row.dataset.j]);
      if (ok) { shown += 1; }
    });
    document.getElementById('shown').textContent =
      shown + ' of ' + rows.length + ' units shown';
    document.querySelectorAll('#index th[data-sort]').forEach(function (th) {
      var on = th.dataset.sort === key;
      var sort = on ? (dir > 0 ? 'ascending' : 'descending') : 'none';
      th.setAttribute('aria-sort', sort);
    });
  }
  document.querySelectorAll('#index th button[data-sort]').forEach(function (b) {
    b.addEventListener('click', function () {
      var k = b.dataset.sort;
      if (k === key) { dir = -dir; } else { key = k; dir = ascendingFirst[k] ? 1 : -1; }
      apply();
    });
  });
  ['f-state', 'f-class', 'f-freq', 'f-sel', 'f-max'].forEach(function (id) {
    var e = document.getElementById(id);
    if (e) {
      e.addEventListener('input', apply);
      e.addEventListener('change', apply);
    }
  });
  apply();
})();
