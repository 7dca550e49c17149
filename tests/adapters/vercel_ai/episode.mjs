// One episode of an AI SDK agent for tests/adapters/test_vercel_ai.py: one call through the task's
// provider with the prompt the adapter hands over, then the result line the adapter reads: the
// task's reward ({"reward": r}) or, with "answer_back", its answer ({"answer": ...}) to be scored.
// Lines printed before the last one are the script's own and are not read.
import { readFileSync } from "node:fs";
import { generateText } from "ai";
import { openai } from "@ai-sdk/openai";
import { anthropic } from "@ai-sdk/anthropic";

const task = JSON.parse(readFileSync(process.env.AREAL_TASK_FILE, "utf8"));
// None of the machine's credentials reach the agent: the adapter passes PATH, LANG, LC_ALL, TZ.
if (process.env.AI_GATEWAY_API_KEY) {
  console.error("the machine's AI_GATEWAY_API_KEY reached the script");
  process.exit(4);
}
if (task.fail) {
  console.error(`failing on purpose with key ${process.env.OPENAI_API_KEY}`);
  process.exit(3);
}
const model = task.provider === "anthropic" ? anthropic(process.env.AREAL_MODEL) : openai.chat(process.env.AREAL_MODEL);
const { text } = await generateText({ model, prompt: process.env.AREAL_PROMPT, maxOutputTokens: 3, maxRetries: 0 });
console.log(`the policy said ${JSON.stringify(text)}`);
console.log(JSON.stringify(task.answer_back ? { answer: task.answer } : { reward: task.r }));
