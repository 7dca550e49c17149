// The Vercel AI SDK, unmodified, against the gateway: the cases of tests/adapters/test_vercel_ai.py
// for one provider, in one Node process, run as an episode by the vercel_ai adapter. The providers
// find the gateway where the AI SDK looks by default (OPENAI_BASE_URL / OPENAI_API_KEY,
// ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY); the model is AREAL_MODEL, the provider the task's
// "provider" ("openai.chat", "openai.responses" or "anthropic").
// Prints one JSON line: case -> what the SDK returned ({ok: true, ...}) or what it threw.
import { readFileSync } from "node:fs";
import { generateObject, generateText, NoObjectGeneratedError, Output, stepCountIs, streamObject, streamText, tool } from "ai";
import { openai } from "@ai-sdk/openai";
import { anthropic } from "@ai-sdk/anthropic";
import { z } from "zod";

const task = JSON.parse(readFileSync(process.env.AREAL_TASK_FILE, "utf8"));
const provider = task.provider;
const model = {
  "openai.chat": () => openai.chat(process.env.AREAL_MODEL),
  "openai.responses": () => openai.responses(process.env.AREAL_MODEL),
  anthropic: () => anthropic(process.env.AREAL_MODEL),
}[provider]();

// Small arguments (a bounded integer, an enum, a boolean): a forced call closes within a few tokens.
const ARGS = z.object({ n: z.number().int().min(0).max(9), op: z.enum(["add", "sub"]), go: z.boolean() });
const ANSWER = z.object({ n: z.number().int().min(0).max(9), ok: z.boolean(), color: z.enum(["red", "blue"]) });
// Anthropic's native structured output carries no numeric bounds (the SDK moves them into the
// description), so its schema has none to break.
const VERDICT = z.object({ ok: z.boolean(), color: z.enum(["red", "blue"]) });
const prompt = "What is 2 plus 3?";
const common = { model, prompt, maxRetries: 0, maxOutputTokens: 128 };
const calcTool = () => tool({ description: "Calculate.", inputSchema: ARGS });
const calls = (r) => r.map(({ toolName, input }) => ({ toolName, input }));

const cases = {
  async plain() {
    const r = await generateText({ ...common, maxOutputTokens: 8 });
    return { text: r.text, finishReason: r.finishReason, outputTokens: r.usage.outputTokens };
  },
  async stream() {
    const r = streamText({ ...common, maxOutputTokens: 8 });
    const deltas = [];
    for await (const delta of r.textStream) deltas.push(delta);
    return { deltas, text: await r.text, finishReason: await r.finishReason };
  },
  async forced_required() {
    const r = await generateText({ ...common, tools: { calc: calcTool() }, toolChoice: "required" });
    return { finishReason: r.finishReason, toolCalls: calls(r.toolCalls) };
  },
  async forced_named() {
    const flip = tool({ description: "Flip a coin.", inputSchema: z.object({ heads: z.boolean() }) });
    const toolChoice = { type: "tool", toolName: "flip" };
    const r = await generateText({ ...common, tools: { calc: calcTool(), flip }, toolChoice });
    return { finishReason: r.finishReason, toolCalls: calls(r.toolCalls) };
  },
  async tool_round_trip() {
    const ran = [];
    const calc = tool({
      description: "Calculate.",
      inputSchema: ARGS,
      execute: async (input) => {
        ran.push(input);
        return { result: 4242 };
      },
    });
    const r = await generateText({
      ...common,
      tools: { calc },
      stopWhen: stepCountIs(2),
      include: { requestBody: true },
      // The untrained policy calls no tool of its own accord: the first step is forced, the
      // second answers with the tool's result in its prompt.
      prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? "required" : "none" }),
    });
    const steps = r.steps.map((s) => ({
      finishReason: s.finishReason,
      toolCalls: calls(s.toolCalls),
      toolResults: s.toolResults.map((t) => t.output),
    }));
    return { ran, steps, secondRequest: JSON.stringify(r.steps[1]?.request?.body ?? null), text: r.text };
  },
  async stream_tool() {
    const r = streamText({ ...common, tools: { calc: calcTool() }, toolChoice: "required" });
    const parts = new Set();
    for await (const part of r.fullStream) parts.add(part.type);
    return { parts: [...parts], finishReason: await r.finishReason, toolCalls: calls(await r.toolCalls) };
  },
  async output_object() {
    const r = await generateText({ ...common, output: Output.object({ schema: ANSWER }) });
    return { output: r.output, finishReason: r.finishReason };
  },
  async stream_output_object() {
    const r = streamText({ ...common, output: Output.object({ schema: ANSWER }) });
    let partials = 0;
    for await (const _ of r.partialOutputStream) partials++;
    return { output: await r.output, partials, finishReason: await r.finishReason };
  },
  async generate_object() {
    const r = await generateObject({ ...common, schema: ANSWER });
    return { object: r.object, finishReason: r.finishReason };
  },
  async stream_object() {
    const r = streamObject({ ...common, schema: ANSWER });
    let partials = 0;
    for await (const _ of r.partialObjectStream) partials++;
    return { object: await r.object, partials, finishReason: await r.finishReason };
  },
};
if (provider === "anthropic") {
  cases.output_native = async () => {
    const providerOptions = { anthropic: { structuredOutputMode: "outputFormat" } };
    const r = await generateText({ ...common, output: Output.object({ schema: VERDICT }), providerOptions });
    return { output: r.output, finishReason: r.finishReason };
  };
} else {
  // JSON mode (response_format / text.format json_object). Any object is allowed, and the untrained
  // policy may still be writing one when the output cap cuts it off: the SDK then throws.
  cases.output_json = async () => {
    try {
      const r = await generateText({ ...common, maxOutputTokens: 128, temperature: 0, output: Output.json() });
      return { output: r.output, finishReason: r.finishReason };
    } catch (err) {
      if (!NoObjectGeneratedError.isInstance(err)) throw err;
      return { cutOff: true, text: err.text, finishReason: err.finishReason };
    }
  };
}

const out = {};
for (const [name, run] of Object.entries(cases)) {
  try {
    out[name] = { ok: true, ...(await run()) };
  } catch (err) {
    out[name] = { ok: false, error: `${err?.name}: ${err?.message}`.slice(0, 2000) };
  }
}
process.stdout.write(JSON.stringify(out) + "\n");
