// Copyright 2026 The icecore Authors
// SPDX-License-Identifier: Apache-2.0

// Helpers for the browser tests: Debian's Chromium, headless, driven by
// playwright-core from the cache directory scripts/browser.sh fills.
//
//   import { withBrowser, waitReady, shot, assertNoPageErrors } from './lib.mjs';
//   await withBrowser(async (page) => {
//     await page.goto(url);
//     let renders = await waitReady(page, 0);
//     await page.fill('#search', 'alpha');
//     renders = await waitReady(page, renders);
//     await shot(page, dir, 'search');
//   });
//
// The page contract: document.body.dataset.state is 'loading' while the page
// fetches and 'ready' after each render, document.body.dataset.renders counts
// the renders, and #status shows what the page is doing (or its error).

import { accessSync, constants, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

export const playwrightDir = process.env.ICECORE_PLAYWRIGHT_DIR || '/var/cache/icecore/playwright';
export const chromiumPath = process.env.ICECORE_CHROMIUM || '/usr/bin/chromium';
// Root cannot use Chromium's sandbox (playwright-core passes --no-sandbox
// too); the machine has no GPU and no network but the loopback, so nothing
// should try either.
export const launchArgs = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'];
export const viewport = { width: 1400, height: 900 };
const READY_TIMEOUT_MS = 30_000;
const CLOSE_TIMEOUT_MS = 10_000;

let playwright;
function loadPlaywright() {
  if (!playwright) {
    // playwright-core is CommonJS; createRequire resolves it from the cache
    // directory as if this file lived there (a bare ESM import would search
    // node_modules above integration/browser and find nothing).
    const require = createRequire(path.join(playwrightDir, 'lib.cjs'));
    try {
      playwright = require('playwright-core');
    } catch (e) {
      throw new Error(`no playwright-core in ${playwrightDir}/node_modules (scripts/browser.sh installs it): ${e.message}`);
    }
  }
  return playwright;
}

const collected = new WeakMap();

// Collects the page's console errors and uncaught exceptions (and a crash)
// from now on; withBrowser does it for the page it makes. A failed
// /favicon.ico request is not counted: Chromium asks for one on every page.
export function collectPageErrors(page) {
  if (collected.has(page)) return collected.get(page);
  const errors = [];
  collected.set(page, errors);
  page.on('console', (message) => {
    if (message.type() !== 'error') return;
    const { url, lineNumber } = message.location();
    if (url && new URL(url, 'http://x/').pathname === '/favicon.ico') return;
    errors.push(`console.error: ${message.text()}${url ? ` (${url}:${lineNumber + 1})` : ''}`);
  });
  page.on('pageerror', (error) => errors.push(`uncaught: ${error.stack || error}`));
  page.on('crash', () => errors.push('the page crashed'));
  return errors;
}

// The errors collected so far on `page` (still counted by assertNoPageErrors).
export function pageErrors(page) {
  return [...(collected.get(page) || [])];
}

// The errors collected so far on `page`, forgotten: for a test that expects
// some (say, the page's report of an agent that is down).
export function takePageErrors(page) {
  const errors = collected.get(page) || [];
  return errors.splice(0, errors.length);
}

export function assertNoPageErrors(page) {
  const errors = pageErrors(page);
  if (errors.length) {
    throw new Error(`the page logged ${errors.length} error(s):\n  ${errors.join('\n  ')}`);
  }
}

// Chromium's browser process: Playwright starts it as the leader of its own
// process group, so a kill of the group takes its renderers along.
async function browserPid(browser) {
  try {
    const cdp = await browser.newBrowserCDPSession();
    const { processInfo } = await cdp.send('SystemInfo.getProcessInfo');
    await cdp.detach().catch(() => {});
    return processInfo.find((p) => p.type === 'browser')?.id;
  } catch {
    return undefined;
  }
}

function kill(pid) {
  for (const target of [-pid, pid]) {
    try {
      process.kill(target, 'SIGKILL');
      return;
    } catch {}
  }
}

// Launches Chromium, calls fn(page) on a page of `viewport`, and returns what
// fn returns. Then fails if the page logged an error that no takePageErrors
// took (unless options.allowPageErrors), and always closes the browser,
// killing it when closing takes more than 10 s.
export async function withBrowser(fn, options = {}) {
  const { allowPageErrors = false, closeTimeoutMs = CLOSE_TIMEOUT_MS } = options;
  try {
    accessSync(chromiumPath, constants.X_OK);
  } catch {
    throw new Error(`no Chromium at ${chromiumPath} (scripts/browser.sh installs Debian's)`);
  }
  const { chromium } = loadPlaywright();
  const browser = await chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: launchArgs,
    timeout: 60_000,
  });
  const pid = await browserPid(browser);
  try {
    const context = await browser.newContext({ viewport });
    const page = await context.newPage();
    collectPageErrors(page);
    const result = await fn(page);
    if (!allowPageErrors) assertNoPageErrors(page);
    return result;
  } finally {
    let timer;
    const closed = browser.close().then(() => true, () => true);
    const timedOut = new Promise((resolve) => {
      timer = setTimeout(() => resolve(false), closeTimeoutMs);
    });
    const ok = await Promise.race([closed, timedOut]);
    clearTimeout(timer);
    if (!ok) {
      console.error(`browser: close hung for ${closeTimeoutMs / 1000} s; killing Chromium (pid ${pid ?? 'unknown'})`);
      if (pid) kill(pid);
      // The connection ends with the process; do not wait on it forever.
      await Promise.race([closed, new Promise((resolve) => setTimeout(resolve, 2_000).unref())]);
    }
  }
}

// Waits until the page has rendered again: state 'ready' and more than
// previousRenders renders. Returns the new render count; after 30 s throws
// with the page's #status and the errors it logged.
export async function waitReady(page, previousRenders, timeoutMs = READY_TIMEOUT_MS) {
  try {
    const handle = await page.waitForFunction(
      (previous) => {
        const body = document.body;
        if (!body || body.dataset.state !== 'ready') return false;
        const renders = Number(body.dataset.renders);
        return renders > previous ? { renders } : false;
      },
      previousRenders,
      { timeout: timeoutMs, polling: 50 },
    );
    const { renders } = await handle.jsonValue();
    await handle.dispose();
    return renders;
  } catch (error) {
    if (error?.name !== 'TimeoutError') throw error;
    const seen = await page
      .evaluate(() => ({
        state: document.body?.dataset.state,
        renders: document.body?.dataset.renders,
        status: document.querySelector('#status')?.textContent?.trim(),
      }))
      .catch((e) => ({ status: `(page unreadable: ${e.message})` }));
    const errors = pageErrors(page);
    throw new Error(
      `page not ready after ${timeoutMs / 1000} s (waiting for renders > ${previousRenders}): ` +
        `state ${JSON.stringify(seen.state)}, renders ${JSON.stringify(seen.renders)}, ` +
        `#status ${JSON.stringify(seen.status ?? null)}; ` +
        (errors.length ? `console errors:\n  ${errors.join('\n  ')}` : 'no console errors'),
    );
  }
}

// A full-page PNG at `${dir}/${name}.png`; returns its path.
export async function shot(page, dir, name) {
  mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  return file;
}
