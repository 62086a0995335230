// Drives the agent's flame graph page as a person would, and prints what it
// saw as one JSON object on stdout for integration/flamegraph.rs to judge.
//
//   node flamegraph_page.mjs PLAN_JSON
//
// PLAN_JSON: {"url": "http://127.0.0.1:PORT", "artifacts": DIR,
//   "split": [from_ms, to_ms], "alpha": [from_ms, to_ms], "beta": [from_ms, to_ms],
//   "pid": the split fixture's pid, "diff_pid": the phases fixture's pid,
//   "click": "beta", "search": "gamma"}
import { withBrowser, waitReady, shot } from './lib.mjs';

const plan = JSON.parse(process.argv[2]);
const out = { steps: [] };

// Every drawn frame: name, type, share, delta, fill colour, position.
async function frames(page) {
  return page.$$eval('#chart g.frame', (gs) =>
    gs.map((g) => {
      const rect = g.querySelector('rect');
      const box = rect.getBoundingClientRect();
      return {
        name: g.getAttribute('name'),
        type: g.dataset.type,
        share: Number(g.dataset.share),
        delta: g.dataset.delta === undefined ? null : Number(g.dataset.delta),
        depth: Number(g.dataset.depth),
        fill: getComputedStyle(rect).fill,
        highlighted: rect.getAttribute('fill') === '#e600e6',
        x: box.x,
        width: box.width,
      };
    })
  );
}

async function top(page) {
  return page.$$eval('#top-table tbody tr', (rows) =>
    rows.map((tr) => ({
      name: tr.dataset.name,
      type: tr.querySelector('td.type').textContent,
      self: Number(tr.querySelector('td.self').dataset.share),
      total: Number(tr.querySelector('td.total').dataset.share),
    }))
  );
}

async function chartWidth(page) {
  return page.$eval('#chart svg', (svg) => svg.getBoundingClientRect().width);
}

await withBrowser(async (page) => {
  const base = plan.url.replace(/\/$/, '');
  const hash = (params) => '#' + new URLSearchParams(params).toString();
  let renders = 0;

  // 1. The split range.
  await page.goto(base + '/' + hash({ from: plan.split[0], to: plan.split[1] }));
  renders = await waitReady(page, renders);
  await shot(page, plan.artifacts, '1-split');
  out.split = {
    frames: await frames(page),
    top: await top(page),
    status: await page.textContent('#status'),
    chart_width: await chartWidth(page),
  };

  // 2. The process filter (kept for the steps after it).
  out.process_options = await page.$$eval('#filter-process option', (os) =>
    os.map((o) => ({ value: o.value, text: o.textContent }))
  );
  await page.selectOption('#filter-process', String(plan.pid));
  renders = await waitReady(page, renders);
  await shot(page, plan.artifacts, '2-process');
  out.process = {
    frames: await frames(page),
    processes_in_top: await top(page),
    status: await page.textContent('#status'),
  };

  // 3. Search.
  await page.fill('#search', plan.search);
  await page.press('#search', 'Enter');
  renders = await waitReady(page, renders);
  await shot(page, plan.artifacts, '3-search');
  out.search = {
    text: await page.textContent('#search-result'),
    share: Number(await page.getAttribute('#search-result', 'data-share')),
    highlighted: (await frames(page)).filter((f) => f.highlighted).map((f) => f.name),
  };
  await page.fill('#search', '');
  await page.press('#search', 'Enter');
  renders = await waitReady(page, renders);

  // 4. Click a frame: it zooms, and the breadcrumb leads back.
  const target = page.locator(`#chart g.frame[name="${plan.click}"]`).first();
  await target.click();
  renders = await waitReady(page, renders);
  await shot(page, plan.artifacts, '4-zoomed');
  const zoomed = await frames(page);
  out.zoom = {
    breadcrumb: await page.$$eval('#breadcrumb a', (as) => as.map((a) => a.textContent)),
    frames: zoomed,
    chart_width: await chartWidth(page),
  };
  await page.click('#breadcrumb a[data-depth="0"]');
  renders = await waitReady(page, renders);
  out.unzoomed_breadcrumb = await page.$$eval('#breadcrumb a', (as) => as.map((a) => a.textContent));

  // 5. A diff: the shown range had only alpha, the baseline only beta.
  await page.goto(
    base + '/' + hash({ from: plan.alpha[0], to: plan.alpha[1], diff_from: plan.beta[0], diff_to: plan.beta[1], pid: plan.diff_pid })
  );
  renders = await waitReady(page, 0);
  await shot(page, plan.artifacts, '5-diff');
  out.diff = {
    frames: await frames(page),
    toggle: await page.isChecked('#diff-toggle'),
    baseline_row_visible: await page.isVisible('#baseline-row'),
  };
  out.download = await page.getAttribute('#download-pprof', 'href');
});

process.stdout.write(JSON.stringify(out) + '\n');
