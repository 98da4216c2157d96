// Table 2 control tuples to a spout's workers from the actions panel (dashboard.js draws
// it, with el() and act() of its own): the answer shown is the controller's 202, which
// says to which workers it went; `typhoon control` also confirms from their metrics.
// The controller refuses them for a bolt and the protocol steps (controller/control_request.py).

// called by dashboard.js (drawActions), one global like its own functions
function spoutControls(app, node) {
  const send = (type, body) => act(`${type} ${node}`, "POST", `/apps/${app}/control`,
    { type, body, node });
  const rate = el("input", { type: "number", min: 0, value: 0, "data-rate-node": node,
    "aria-label": `input rate of ${node} in tuples/s (0: unlimited)` });
  const button = (action, label, onclick) => el("button", { "data-action": action,
    "data-node": node, onclick }, label);
  return [
    rate,
    button("input-rate", "set rate/s", () => send("INPUT_RATE", { rate: Number(rate.value) })),
    button("activate", "activate", () => send("ACTIVATE", {})),
    button("deactivate", "deactivate", () => send("DEACTIVATE", {})),
  ];
}
