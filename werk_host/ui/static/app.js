// The operator's page (docs/ui.md): sign-in, the role of the key, and the views. The key lives
// in this tab's sessionStorage only (api.js). A key is an operator's when the protocol answers
// an operator-only read for it: GET /werk/v1/deployments/{id}/logs is 200 for an operator and
// 403 for any other key (docs/deployments.md, "Operator actions"); the buttons follow that
// answer and the host still decides every action.

import { ApiError, call, signIn, signOut, signedIn } from "./api.js";
import { InstancesView } from "./instances.js";
import { JobsView } from "./jobs.js";
import { MemoryHistory, MemoryView } from "./memory.js";
import { PlaygroundView } from "./playground.js";
import { StatesView } from "./states.js";
import { TrafficView } from "./traffic.js";
import { fill, say } from "./util.js";

const VIEWS = {
  instances: { make: (root, ctx) => new InstancesView(root, ctx), poll: 2000 },
  memory: { make: (root, ctx) => new MemoryView(root, ctx), poll: 0 },
  states: { make: (root) => new StatesView(root), poll: 0 },
  jobs: { make: (root) => new JobsView(root), poll: 2000 },
  traffic: { make: (root) => new TrafficView(root), poll: 3000 },
  playground: { make: (root) => new PlaygroundView(root), poll: 0 },
};
const MEMORY_POLL_MS = 3000;

const ctx = { operator: false, memory: new MemoryHistory() };
let current = null;
let timer = null;
let memoryTimer = null;

const $ = (id) => document.getElementById(id);

async function role() {
  const report = await call("GET", "/werk/v1/deployments");
  if (!report.inventory.length) return false;
  try {
    await call("GET", `/werk/v1/deployments/${encodeURIComponent(report.inventory[0].id)}/logs?lines=1`);
    return true;
  } catch (err) {
    if (err instanceof ApiError && err.status === 403) return false;
    throw err;
  }
}

function show(name) {
  if (!(name in VIEWS)) name = "instances";
  if (current && current.view.stop) current.view.stop();
  clearInterval(timer);
  const root = $("view");
  fill(root);
  const spec = VIEWS[name];
  const view = spec.make(root, ctx);
  current = { name, view };
  root.dataset.view = name;
  for (const button of document.querySelectorAll("#nav button")) {
    button.setAttribute("aria-current", button.dataset.view === name ? "page" : "false");
  }
  view.refresh();
  if (spec.poll) timer = setInterval(() => view.refresh(), spec.poll);
}

async function enter() {
  try {
    await call("GET", "/werk/v1/info");
    ctx.operator = await role();
  } catch (err) {
    leave(err.status === 401 ? "That key was refused." : `The host did not answer: ${err.message}`);
    return;
  }
  $("signin").hidden = true;
  $("app").hidden = false;
  $("who").textContent = ctx.operator ? "operator key" : "client key";
  $("who").dataset.role = ctx.operator ? "operator" : "client";
  clearInterval(memoryTimer);
  const sample = () => ctx.memory.sample().catch(() => {});
  sample();
  memoryTimer = setInterval(sample, MEMORY_POLL_MS);
  show(location.hash.slice(1));
}

function leave(message = "") {
  signOut();
  clearInterval(timer);
  clearInterval(memoryTimer);
  if (current && current.view.stop) current.view.stop();
  current = null;
  ctx.memory = new MemoryHistory();
  fill($("view"));
  $("app").hidden = true;
  $("signin").hidden = false;
  say($("signin-error"), message, Boolean(message));
  $("key").value = "";
  $("key").focus();
}

function start() {
  $("signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("key").value.trim());
    $("key").value = "";
    enter();
  });
  $("signout").addEventListener("click", () => leave());
  for (const button of document.querySelectorAll("#nav button")) {
    button.addEventListener("click", () => {
      history.replaceState(null, "", `#${button.dataset.view}`);
      show(button.dataset.view);
    });
  }
  window.addEventListener("werk-signed-out", () => leave("The host refused the key (401); sign in again."));
  if (signedIn()) enter();
  else leave();
}

start();
