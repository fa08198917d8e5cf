/**
 * The compactd extension: starts `compactd serve` through vscode-languageclient (stdio),
 * keeps a status bar item with the followed session's context occupancy, and offers
 * "compactd: Show Context" and "compactd: Compact". What is shown is computed in view.ts.
 */
import * as vscode from "vscode";
import { LanguageClient, type LanguageClientOptions, type ServerOptions } from "vscode-languageclient/node";
import type {
  CompactParams,
  CompactResult,
  ListResult,
  MeasureResult,
  RenderParams,
} from "./generated/protocol.js";
import {
  chooseSession,
  compactMessage,
  contextItems,
  contextLines,
  daemonCommand,
  errorMessage,
  idleStatusView,
  instructionsFrom,
  serveArgs,
  startFailureMessage,
  statusView,
  type StatusView,
} from "./view.js";

const SECTION = "compactd";

let client: LanguageClient | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const output = vscode.window.createOutputChannel("compactd", { log: true });
  const status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  status.command = "compactd.showContext";
  context.subscriptions.push(output, status);
  const daemon = new Daemon(context, output, status);

  context.subscriptions.push(
    vscode.commands.registerCommand("compactd.showContext", async () => {
      const started = await daemon.ready();
      if (started) await showContext(started.client, output);
    }),
    vscode.commands.registerCommand("compactd.compact", async () => {
      const started = await daemon.ready();
      if (started) await compact(started.client, started.refresh);
    }),
    vscode.workspace.onDidChangeConfiguration((event) => {
      if (event.affectsConfiguration(SECTION)) daemon.refresh?.restartTimer();
    }),
  );
  // No daemon per window unless asked: it starts on the first command, or now with the setting.
  if (settings().get<boolean>("startWithWorkspace")) await daemon.ready();
}

export async function deactivate(): Promise<void> {
  await client?.stop();
  client = undefined;
}

function settings(): vscode.WorkspaceConfiguration {
  return vscode.workspace.getConfiguration(SECTION);
}

/** The daemon, started once on first need; a failed start is said clearly and retried next time. */
class Daemon {
  refresh: Refresher | undefined;
  private starting: Promise<{ client: LanguageClient; refresh: Refresher } | undefined> | undefined;

  constructor(
    private readonly context: vscode.ExtensionContext,
    private readonly output: vscode.LogOutputChannel,
    private readonly status: vscode.StatusBarItem,
  ) {}

  ready(): Promise<{ client: LanguageClient; refresh: Refresher } | undefined> {
    this.starting ??= this.start().then((started) => {
      if (started === undefined) this.starting = undefined;
      return started;
    });
    return this.starting;
  }

  private async start(): Promise<{ client: LanguageClient; refresh: Refresher } | undefined> {
    showStatus(this.status, idleStatusView("starting the daemon"));
    this.status.show();
    const { started, command } = startDaemon(this.output);
    try {
      await started.start();
    } catch (error) {
      const message = startFailureMessage(error, command);
      showStatus(this.status, idleStatusView(message));
      this.output.error(message);
      void started.dispose().catch(() => undefined);
      void vscode.window.showErrorMessage(message, "Open Settings").then((choice) => {
        if (choice) void vscode.commands.executeCommand("workbench.action.openSettings", "compactd.command");
      });
      return undefined;
    }
    // Stopped in deactivate (shutdown, exit), which VS Code awaits, unlike disposables.
    client = started;
    const refresh = new Refresher(started, this.status, this.output);
    this.refresh = refresh;
    // The daemon tells us when the context changes; the timer covers agents that write
    // through another daemon when it cannot.
    this.context.subscriptions.push(
      refresh,
      started.onNotification("context/compacted", () => refresh.now()),
      started.onNotification("session/changed", () => refresh.now()),
    );
    refresh.restartTimer();
    await refresh.now();
    return { client: started, refresh };
  }
}

function startDaemon(output: vscode.LogOutputChannel): { started: LanguageClient; command: string } {
  const config = settings();
  const { command, args } = daemonCommand(config.get<string>("command"), process.env.COMPACTD_COMMAND);
  const serverOptions: ServerOptions = {
    command,
    // No `transport`: the arguments below end with `serve`, which also takes `--stdio`.
    args: [
      ...args,
      ...serveArgs({
        dataDir: config.get<string>("dataDir"),
        summaryProvider: config.get<string>("summaryProvider"),
      }),
    ],
  };
  const clientOptions: LanguageClientOptions = { documentSelector: [], outputChannel: output };
  return { started: new LanguageClient("compactd", "compactd", serverOptions, clientOptions), command };
}

function showStatus(item: vscode.StatusBarItem, view: StatusView): void {
  item.text = view.text;
  item.tooltip = view.tooltip;
  item.backgroundColor =
    view.severity === "normal"
      ? undefined
      : new vscode.ThemeColor(view.severity === "error" ? "statusBarItem.errorBackground" : "statusBarItem.warningBackground");
}

/** The session to show now: the setting, else the newest one the daemon lists. */
async function currentSession(daemon: LanguageClient): Promise<string | undefined> {
  const configured = settings().get<string>("sessionId");
  if (configured?.trim()) return chooseSession(configured, undefined);
  const list = await daemon.sendRequest<ListResult>("session/list", {});
  return chooseSession(undefined, list);
}

async function measure(daemon: LanguageClient, sessionId: string): Promise<MeasureResult> {
  const params: RenderParams = { sessionId };
  return daemon.sendRequest<MeasureResult>("context/measure", params);
}

/** Re-measures on a timer and on demand, never two at a time. */
class Refresher implements vscode.Disposable {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;

  constructor(
    private readonly daemon: LanguageClient,
    private readonly item: vscode.StatusBarItem,
    private readonly output: vscode.LogOutputChannel,
  ) {}

  restartTimer(): void {
    clearInterval(this.timer);
    const seconds = Math.max(1, settings().get<number>("refreshSeconds") ?? 15);
    this.timer = setInterval(() => void this.now(), seconds * 1000);
  }

  now(): Promise<void> {
    this.running ??= this.measure().finally(() => (this.running = undefined));
    return this.running;
  }

  private async measure(): Promise<void> {
    if (!this.daemon.isRunning()) return;
    try {
      const sessionId = await currentSession(this.daemon);
      if (sessionId === undefined) {
        showStatus(this.item, idleStatusView("no session yet (set compactd.sessionId or start an agent)"));
        return;
      }
      showStatus(this.item, statusView(await measure(this.daemon, sessionId), sessionId));
    } catch (error) {
      showStatus(this.item, idleStatusView(errorMessage(error)));
      this.output.error(errorMessage(error));
    }
  }

  dispose(): void {
    clearInterval(this.timer);
  }
}

async function showContext(daemon: LanguageClient, output: vscode.LogOutputChannel): Promise<void> {
  try {
    const sessionId = await currentSession(daemon);
    if (sessionId === undefined) {
      void vscode.window.showInformationMessage("compactd: no session to show yet.");
      return;
    }
    const result = await measure(daemon, sessionId);
    output.info([`context of ${sessionId}:`, ...contextLines(result).map((line) => `  ${line}`)].join("\n"));
    await vscode.window.showQuickPick(contextItems(result), {
      title: `compactd: context of ${sessionId}`,
      placeHolder: statusView(result, sessionId).text,
      matchOnDescription: true,
    });
  } catch (error) {
    void vscode.window.showErrorMessage(errorMessage(error));
  }
}

async function compact(daemon: LanguageClient, refresh: Refresher): Promise<void> {
  try {
    const sessionId = await currentSession(daemon);
    if (sessionId === undefined) {
      void vscode.window.showInformationMessage("compactd: no session to compact yet.");
      return;
    }
    const answer = instructionsFrom(
      await vscode.window.showInputBox({
        title: `compactd: compact ${sessionId}`,
        prompt: "Instructions for the summary (optional; Enter to compact without)",
        placeHolder: "e.g. keep the failing test names and the file paths",
      }),
    );
    if (answer.cancelled) return;
    const params: CompactParams = { sessionId, ...(answer.instructions ? { instructions: answer.instructions } : {}) };
    const result = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: "compactd: compacting…", cancellable: true },
      (_progress, token) => daemon.sendRequest<CompactResult>("context/compact", params, token),
    );
    void vscode.window.showInformationMessage(compactMessage(result));
    await refresh.now();
  } catch (error) {
    void vscode.window.showErrorMessage(errorMessage(error));
  }
}
