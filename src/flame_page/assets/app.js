// icecore's flame graph page. The agent aggregates and prunes (see
// /api/flamegraph); this script draws with d3-flame-graph, keeps the view's
// state in the URL's fragment (so a view can be shared or reloaded), and
// shows every name as text, never as markup.
'use strict';

(function () {
  const TYPE_COLORS = {
    native: '#f28e2b',
    kernel: '#bab0ac',
    cpython: '#4e79a7',
    ruby: '#e15759',
    php: '#b07aa1',
    perl: '#76b7b2',
    jvm: '#59a14f',
    v8js: '#edc948',
    dotnet: '#9c755f',
    root: '#d0d0d0',
  };
  const FILTERS = ['pid', 'tid', 'container', 'pod', 'service'];
  const TOP_ROWS = 100;

  const $ = (id) => document.getElementById(id);
  const body = document.body;
  let state = readState();
  let view = null; // the last answer
  let chart = null;
  let renders = 0;
  let pending = null; // AbortController of the request in flight
  let topSort = 'total';

  // ---- state <-> URL fragment ----
  function readState() {
    const p = new URLSearchParams(location.hash.slice(1));
    const num = (k) => (p.has(k) && p.get(k) !== '' ? Number(p.get(k)) : null);
    return {
      kind: p.get('kind') || 'cpu',
      last: p.has('from') ? null : Number(p.get('last') || 300),
      from: num('from'),
      to: num('to'),
      diffFrom: num('diff_from'),
      diffTo: num('diff_to'),
      pid: p.get('pid') || '',
      tid: p.get('tid') || '',
      container: p.get('container') || '',
      pod: p.get('pod') || '',
      service: p.get('service') || '',
      types: p.get('types') ? p.get('types').split(',') : [],
      focus: p.getAll('focus'),
      search: p.get('search') || '',
      flame: p.get('flame') === '1',
    };
  }

  // The range, filters and focus: what both the URL and the API carry.
  function viewParams() {
    const p = new URLSearchParams();
    p.set('kind', state.kind);
    if (state.from !== null && state.to !== null) {
      p.set('from', state.from);
      p.set('to', state.to);
    } else {
      p.set('last', state.last || 300);
    }
    for (const k of FILTERS) if (state[k]) p.set(k, state[k]);
    if (state.types.length) p.set('types', state.types.join(','));
    for (const f of state.focus) p.append('focus', f);
    return p;
  }

  function writeState() {
    const p = viewParams();
    if (diffOn()) {
      p.set('diff_from', state.diffFrom);
      p.set('diff_to', state.diffTo);
    }
    if (state.search) p.set('search', state.search);
    if (state.flame) p.set('flame', '1');
    history.replaceState(null, '', '#' + p.toString());
  }

  // The API's parameters for the state; `forDownload` leaves out what only
  // shapes the drawing.
  function apiParams(forDownload) {
    const p = viewParams();
    if (!forDownload) {
      if (diffOn()) {
        p.set('diff_from', state.diffFrom);
        p.set('diff_to', state.diffTo);
      }
      if (state.search) p.set('search', state.search);
      // About one node per pixel column at most.
      const width = Math.max(400, $('chart').clientWidth || 1200);
      p.set('min_share', (1 / (2 * width)).toFixed(6));
    }
    return p;
  }

  function diffOn() {
    return state.diffFrom !== null && state.diffTo !== null;
  }

  // ---- formatting ----
  function fmtValue(v) {
    if (!view || view.unit === 'samples') return d3.format(',')(v) + ' samples';
    return fmtNanos(v);
  }
  function fmtNanos(ns) {
    if (ns >= 1e9) return (ns / 1e9).toFixed(2) + ' s';
    if (ns >= 1e6) return (ns / 1e6).toFixed(2) + ' ms';
    return (ns / 1e3).toFixed(1) + ' µs';
  }
  function pct(part, whole) {
    return whole > 0 ? (100 * part) / whole : 0;
  }
  function fmtPct(x) {
    return x.toFixed(2) + '%';
  }
  function fmtTime(ms) {
    return new Date(ms).toLocaleTimeString();
  }

  // ---- loading ----
  async function load() {
    writeState();
    if (pending) pending.abort();
    pending = new AbortController();
    body.dataset.state = 'loading';
    $('download-pprof').href = '/api/flamegraph.pprof?' + apiParams(true).toString();
    let answer;
    try {
      const response = await fetch('/api/flamegraph?' + apiParams(false).toString(), {
        signal: pending.signal,
      });
      const text = await response.text();
      if (!response.ok) throw new Error(text.trim() || response.statusText);
      answer = JSON.parse(text);
    } catch (e) {
      if (e.name === 'AbortError') return;
      $('status').textContent = 'Could not load the profile: ' + e.message;
      body.dataset.state = 'error';
      return;
    }
    view = answer;
    draw();
    renders += 1;
    body.dataset.renders = String(renders);
    body.dataset.state = 'ready';
  }

  // ---- drawing ----
  function draw() {
    drawTimelines();
    drawFilters();
    drawTypes();
    drawBreadcrumb();
    drawChart();
    drawSearch();
    drawTop();
    const range = view.range
      ? fmtTime(view.range.from) + ' – ' + fmtTime(view.range.to)
      : 'no data in this range yet';
    const diff = view.baseline
      ? ' · baseline ' + fmtTime(view.baseline.from) + ' – ' + fmtTime(view.baseline.to) +
        ' (' + fmtValue(view.base_total) + ')'
      : '';
    const pruned = view.nodes < view.all_nodes
      ? ' · ' + d3.format(',')(view.nodes) + ' of ' + d3.format(',')(view.all_nodes) +
        ' call paths drawn (the rest are narrower than a pixel)'
      : '';
    $('status').textContent = fmtValue(view.total) + ' · ' + range + diff + pruned;
    $('kind').value = state.kind;
    $('preset').value = state.from !== null ? 'custom' : String(state.last || 300);
    $('diff-toggle').checked = diffOn();
    $('baseline-row').hidden = !diffOn();
    $('flame-toggle').checked = state.flame;
  }

  function drawTimeline(svgId, selected, onSelect) {
    const svg = d3.select('#' + svgId);
    const node = svg.node();
    const width = node.clientWidth || 1000;
    const height = 48;
    svg.selectAll('*').remove();
    const points = view.timeline;
    if (!points.length) return;
    const x = d3
      .scaleTime()
      .domain([d3.min(points, (p) => p.from), d3.max(points, (p) => p.to)])
      .range([0, width]);
    const y = d3
      .scaleLinear()
      .domain([0, d3.max(points, (p) => p.value) || 1])
      .range([height - 14, 2]);
    svg
      .append('g')
      .selectAll('rect')
      .data(points)
      .join('rect')
      .attr('class', 'bar')
      .attr('x', (p) => x(p.from))
      .attr('width', (p) => Math.max(1, x(p.to) - x(p.from) - 1))
      .attr('y', (p) => y(p.value))
      .attr('height', (p) => height - 14 - y(p.value));
    svg
      .append('g')
      .attr('transform', 'translate(0,' + (height - 14) + ')')
      .call(d3.axisBottom(x).ticks(8).tickSize(3));
    const brush = d3
      .brushX()
      .extent([
        [0, 0],
        [width, height - 14],
      ])
      .on('end', (event) => {
        if (!event.sourceEvent || !event.selection) return;
        const [a, b] = event.selection.map((px) => Math.round(x.invert(px).getTime()));
        onSelect(a, b);
      });
    const g = svg.append('g').call(brush);
    if (selected) {
      const a = Math.max(0, x(selected.from));
      const b = Math.min(width, x(selected.to));
      if (b > a) g.call(brush.move, [a, b]);
    }
  }

  function drawTimelines() {
    drawTimeline('timeline', view.range, (a, b) => {
      state.from = a;
      state.to = b;
      state.focus = [];
      load();
    });
    if (diffOn()) {
      drawTimeline('timeline-baseline', view.baseline, (a, b) => {
        state.diffFrom = a;
        state.diffTo = b;
        load();
      });
    }
  }

  function drawFilters() {
    const lists = {
      pid: view.filters.processes,
      tid: view.filters.threads,
      container: view.filters.containers,
      pod: view.filters.pods,
      service: view.filters.services,
    };
    for (const select of document.querySelectorAll('#filters select')) {
      const param = select.dataset.param;
      const entries = lists[param] || [];
      select.replaceChildren();
      const all = document.createElement('option');
      all.value = '';
      all.textContent = 'all (' + entries.length + ')';
      select.append(all);
      let found = false;
      for (const f of entries) {
        const o = document.createElement('option');
        o.value = f.key;
        o.textContent = f.label + ' · ' + fmtPct(pct(f.value, view.total || 1));
        if (f.key === state[param]) found = true;
        select.append(o);
      }
      if (state[param] && !found) {
        const o = document.createElement('option');
        o.value = state[param];
        o.textContent = state[param] + ' (not in this range)';
        select.append(o);
      }
      select.value = state[param];
      select.disabled = entries.length === 0 && !state[param];
    }
  }

  function drawTypes() {
    const box = $('filter-types');
    box.replaceChildren();
    const title = document.createElement('span');
    title.textContent = 'Frame types:';
    box.append(title);
    const present = view.filters.types.map((f) => f.key);
    for (const t of state.types) if (!present.includes(t)) present.push(t);
    for (const type of present) {
      const label = document.createElement('label');
      const input = document.createElement('input');
      input.type = 'checkbox';
      input.value = type;
      input.checked = state.types.length === 0 || state.types.includes(type);
      input.addEventListener('change', () => {
        const checked = [...box.querySelectorAll('input:checked')].map((i) => i.value);
        state.types = checked.length === present.length ? [] : checked;
        state.focus = [];
        load();
      });
      const swatch = document.createElement('span');
      swatch.className = 'swatch';
      swatch.style.background = TYPE_COLORS[type] || '#999';
      label.append(input, swatch, document.createTextNode(type));
      box.append(label);
    }
  }

  function drawBreadcrumb() {
    const nav = $('breadcrumb');
    nav.replaceChildren();
    const crumbs = ['all', ...view.focus];
    crumbs.forEach((name, i) => {
      if (i > 0) {
        const sep = document.createElement('span');
        sep.className = 'sep';
        sep.textContent = '›';
        nav.append(sep);
      }
      const a = document.createElement('a');
      a.textContent = name;
      a.dataset.depth = String(i);
      a.addEventListener('click', () => {
        state.focus = view.focus.slice(0, i);
        load();
      });
      nav.append(a);
    });
    nav.dataset.focus = JSON.stringify(view.focus);
  }

  // Width in a diff: the mean of the node's shares of both ranges, so that
  // what only one range has still shows.
  function toChartData(node) {
    const diff = diffOn() && view.base_total !== null;
    const total = view.total || 0;
    const base = view.base_total || 0;
    const share = pct(node.total, total);
    const baseShare = diff ? pct(node.base_total || 0, base) : 0;
    const out = {
      name: node.name,
      type: node.type,
      total: node.total,
      self: node.self,
      base_total: node.base_total || 0,
      base_self: node.base_self || 0,
      share,
      baseShare,
      delta: share - baseShare,
      value: diff ? (total ? node.total / total : 0) + (base ? (node.base_total || 0) / base : 0) : node.total,
    };
    if (node.children) out.children = node.children.map(toChartData);
    return out;
  }

  function colorOf(d) {
    const data = d.data;
    if (d.highlight) return '#e600e6';
    if (diffOn()) {
      // Red: more of the shown range than of the baseline; blue: less.
      const t = Math.min(1, Math.abs(data.delta) / 10);
      if (Math.abs(data.delta) < 0.05) return '#dddddd';
      return data.delta > 0
        ? d3.interpolateRgb('#f5d0d0', '#d62728')(t)
        : d3.interpolateRgb('#d0dcf5', '#1f4fd6')(t);
    }
    const base = d3.color(TYPE_COLORS[data.type] || '#999999');
    // Neighbours of one type differ a little, by name.
    let h = 0;
    for (let i = 0; i < Math.min(8, data.name.length); i++) h = (h * 31 + data.name.charCodeAt(i)) % 997;
    return base.brighter((h / 997) * 0.6 - 0.2).formatHex();
  }

  function labelOf(d) {
    const x = d.data;
    const lines = [x.name + '  [' + x.type + ']'];
    lines.push(
      'total ' + fmtValue(x.total) + ' (' + fmtPct(x.share) + ')  ·  self ' +
        fmtValue(x.self) + ' (' + fmtPct(pct(x.self, view.total)) + ')'
    );
    if (diffOn()) {
      lines.push(
        'baseline ' + fmtValue(x.base_total) + ' (' + fmtPct(x.baseShare) + ')  ·  change ' +
          (x.delta >= 0 ? '+' : '') + x.delta.toFixed(2) + ' points'
      );
    }
    return lines.join('\n');
  }

  function pathTo(d) {
    const names = [];
    for (let n = d; n && n.depth > 0; n = n.parent) names.unshift(n.data.name);
    // The drawn root is `all`, or the focused frame (already in the focus).
    return view.focus.length ? view.focus.concat(names) : names;
  }

  function drawChart() {
    const el = $('chart');
    const data = toChartData(view.tree);
    if (!chart) {
      chart = flamegraph
        .default()
        .width(el.clientWidth || 1200)
        .cellHeight(18)
        .transitionDuration(0)
        .minFrameSize(1)
        .inverted(!state.flame)
        .resetHeightOnZoom(true)
        .sort((a, b) => d3.ascending(a.data.name, b.data.name))
        .setColorMapper(colorOf)
        .setLabelHandler(labelOf)
        .setSearchMatch((d, term) => !!term && d.data.name.toLowerCase().includes(term.toLowerCase()))
        .setSearchHandler(() => {})
        .setDetailsHandler((text) => {
          $('details').textContent = text || '\u00a0';
        })
        .onClick((d) => {
          if (d.depth === 0) {
            if (view.focus.length) state.focus = view.focus.slice(0, -1);
          } else {
            state.focus = pathTo(d);
          }
          load();
        });
      d3.select(el).datum(data).call(chart);
    } else {
      chart.inverted(!state.flame).width(el.clientWidth || 1200);
      chart.update(data);
    }
    if (state.search) chart.search(state.search);
    else chart.clear();
    // What the drawing shows, as attributes: for tests and for scripts.
    d3.select(el)
      .selectAll('g.frame')
      .each(function (d) {
        this.dataset.type = d.data.type;
        this.dataset.total = String(d.data.total);
        this.dataset.share = d.data.share.toFixed(3);
        this.dataset.depth = String(d.depth);
        if (diffOn()) this.dataset.delta = d.data.delta.toFixed(3);
      });
  }

  function drawSearch() {
    const out = $('search-result');
    $('search').value = state.search;
    if (!view.search) {
      out.textContent = '';
      delete out.dataset.share;
      return;
    }
    const s = view.search;
    const share = pct(s.value, view.total);
    out.dataset.share = share.toFixed(3);
    out.dataset.value = String(s.value);
    let text = '“' + s.term + '”: ' + fmtPct(share) + ' (' + fmtValue(s.value) + ') in ' +
      s.matching_names + ' matching function' + (s.matching_names === 1 ? '' : 's');
    if (view.search.base_value !== null && diffOn()) {
      text += ' · baseline ' + fmtPct(pct(s.base_value, view.base_total));
    }
    out.textContent = text;
  }

  function drawTop() {
    const rows = view.top.slice();
    const key = topSort;
    rows.sort((a, b) =>
      key === 'name' || key === 'type' ? d3.ascending(a[key], b[key]) : b[key] - a[key]
    );
    const tbody = $('top-table').querySelector('tbody');
    tbody.replaceChildren();
    for (const r of rows.slice(0, TOP_ROWS)) {
      const tr = document.createElement('tr');
      tr.dataset.name = r.name;
      const cell = (cls, text, share) => {
        const td = document.createElement('td');
        td.className = cls;
        td.textContent = text;
        if (share !== undefined) td.dataset.share = share.toFixed(3);
        tr.append(td);
      };
      cell('name', r.name);
      cell('type', r.type);
      const self = pct(r.self, view.total);
      const total = pct(r.total, view.total);
      cell('num self', fmtPct(self), self);
      cell('num total', fmtPct(total), total);
      tr.title = r.name;
      tbody.append(tr);
    }
    for (const th of document.querySelectorAll('#top-table th')) {
      th.classList.toggle('sorted', th.dataset.sort === topSort);
    }
  }

  // ---- controls ----
  $('kind').addEventListener('change', (e) => {
    state.kind = e.target.value;
    state.focus = [];
    load();
  });
  $('preset').addEventListener('change', (e) => {
    if (e.target.value === 'custom') return;
    state.last = Number(e.target.value);
    state.from = state.to = null;
    load();
  });
  $('diff-toggle').addEventListener('change', (e) => {
    if (e.target.checked && view && view.range) {
      // Start with the range just before the shown one, of its length.
      const len = view.range.to - view.range.from;
      state.diffFrom = view.range.from - len;
      state.diffTo = view.range.from;
    } else {
      state.diffFrom = state.diffTo = null;
    }
    load();
  });
  $('flame-toggle').addEventListener('change', (e) => {
    state.flame = e.target.checked;
    load();
  });
  $('refresh').addEventListener('click', () => load());
  for (const select of document.querySelectorAll('#filters select')) {
    select.addEventListener('change', () => {
      state[select.dataset.param] = select.value;
      if (select.dataset.param === 'pid') state.tid = '';
      state.focus = [];
      load();
    });
  }
  $('search-form').addEventListener('submit', (e) => {
    e.preventDefault();
    state.search = $('search').value.trim();
    load();
  });
  $('search').addEventListener('search', () => {
    // The clear button of a search field.
    if ($('search').value === '' && state.search) {
      state.search = '';
      load();
    }
  });
  for (const th of document.querySelectorAll('#top-table th')) {
    th.addEventListener('click', () => {
      topSort = th.dataset.sort;
      if (view) drawTop();
    });
  }
  window.addEventListener('hashchange', () => {
    state = readState();
    load();
  });
  let resizeTimer = null;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => view && load(), 300);
  });

  load();
})();
