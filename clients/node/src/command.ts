import { accessSync, constants, statSync } from "node:fs";
import { delimiter, isAbsolute, join } from "node:path";

/** The environment variable naming the daemon command (`compactd`, or e.g. `python -m compactd`). */
export const COMMAND_ENV = "COMPACTD_COMMAND";

/** What to run to start a daemon, before `[--data-dir DIR] serve [...]` is added. */
export interface DaemonCommand {
  file: string;
  args: string[];
}

/**
 * Which command starts the daemon: the explicit option, else `$COMPACTD_COMMAND`, else
 * `compactd` found on PATH. A string is split on whitespace (a path with spaces needs the
 * array form); the env variable may also hold a JSON array for that case.
 */
export function resolveCommand(
  command: string | readonly string[] | undefined,
  env: NodeJS.ProcessEnv = process.env,
): DaemonCommand {
  const words = command !== undefined ? toWords(command) : fromEnv(env[COMMAND_ENV]);
  if (words !== undefined) {
    const [file, ...args] = words;
    if (file === undefined || file === "") {
      throw new Error(`the compactd command is empty (option \`command\` or $${COMMAND_ENV})`);
    }
    return { file, args };
  }
  const found = findOnPath("compactd", env);
  if (found === undefined) {
    throw new Error(
      "cannot find `compactd` on PATH: install it from the compactd repository (`pipx install .`, " +
        "or `make install` and use `.venv/bin/compactd`), or pass the " +
        `\`command\` option or set $${COMMAND_ENV} (e.g. "/path/to/.venv/bin/compactd")`,
    );
  }
  return { file: found, args: [] };
}

function toWords(command: string | readonly string[]): string[] {
  return typeof command === "string" ? command.trim().split(/\s+/) : [...command];
}

function fromEnv(value: string | undefined): string[] | undefined {
  if (value === undefined || value.trim() === "") return undefined;
  const text = value.trim();
  if (text.startsWith("[")) {
    const parsed: unknown = JSON.parse(text);
    if (!Array.isArray(parsed) || !parsed.every((w) => typeof w === "string")) {
      throw new Error(`$${COMMAND_ENV} looks like JSON but is not an array of strings`);
    }
    return parsed as string[];
  }
  return toWords(text);
}

/** The first executable `name` in PATH (with PATHEXT suffixes on Windows), if any. */
export function findOnPath(name: string, env: NodeJS.ProcessEnv = process.env): string | undefined {
  if (isAbsolute(name)) return isExecutable(name) ? name : undefined;
  const dirs = (env.PATH ?? env.Path ?? "").split(delimiter).filter(Boolean);
  const suffixes =
    process.platform === "win32" ? ["", ...(env.PATHEXT ?? ".EXE;.CMD;.BAT").split(";")] : [""];
  for (const dir of dirs) {
    for (const suffix of suffixes) {
      const candidate = join(dir, name + suffix);
      if (isExecutable(candidate)) return candidate;
    }
  }
  return undefined;
}

function isExecutable(path: string): boolean {
  try {
    if (!statSync(path).isFile()) return false;
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}
