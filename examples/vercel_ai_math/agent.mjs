// A math agent written with the Vercel AI SDK, as it would run against OpenAI.
//
// It offers the model a calculator tool, lets the SDK run the tool calls the model makes (up to
// AREAL_MAX_TURNS model calls), and prints the final text as {"answer": ...}; areal's math_answer
// reward scores it against the task's answer. Nothing in here knows about areal beyond reading the
// prompt and model from the environment: `openai` finds the gateway and the episode's key in
// OPENAI_BASE_URL and OPENAI_API_KEY, as it would find OpenAI's. `anthropic(...)` from
// @ai-sdk/anthropic would go through the gateway's Anthropic route the same way.
import { generateText, stepCountIs, tool } from "ai";
import { openai } from "@ai-sdk/openai";
import { z } from "zod";

const SYSTEM =
  "Solve the arithmetic problem. Call the calculator tool for the arithmetic, then reply with the number only.";

const calculator = tool({
  description: "Evaluate an arithmetic expression of integers with + - * and parentheses.",
  inputSchema: z.object({ expression: z.string() }),
  // A bad call gets an error message back, as a real tool would send.
  execute: async ({ expression }) => {
    try {
      return String(evaluate(expression));
    } catch (err) {
      return `error: ${err.message}`;
    }
  },
});

const { text } = await generateText({
  model: openai.chat(process.env.AREAL_MODEL),
  system: SYSTEM,
  prompt: process.env.AREAL_PROMPT,
  tools: { calculator },
  stopWhen: stepCountIs(Number(process.env.AREAL_MAX_TURNS ?? 4)),
  maxOutputTokens: 48,
  maxRetries: 0, // a retry would be a second, recorded turn
});
console.log(JSON.stringify({ answer: text }));

/** Integers, + - * and parentheses, by recursive descent (no eval). */
function evaluate(source) {
  const tokens = source.match(/\d+|[-+*()]|\S/g) ?? [];
  let at = 0;
  const peek = () => tokens[at];
  const take = () => tokens[at++];
  const primary = () => {
    const token = take();
    if (token === "-") return -primary();
    if (token === "(") {
      const value = sum();
      if (take() !== ")") throw new Error("missing )");
      return value;
    }
    if (/^\d+$/.test(token ?? "")) return Number(token);
    throw new Error("only integers, + - * and parentheses");
  };
  const product = () => {
    let value = primary();
    while (peek() === "*") value *= (take(), primary());
    return value;
  };
  const sum = () => {
    let value = product();
    while (peek() === "+" || peek() === "-") value = take() === "+" ? value + product() : value - product();
    return value;
  };
  const value = sum();
  if (at !== tokens.length) throw new Error(`unexpected ${peek()}`);
  return value;
}
