// The JavaScript clients of tests/test_agents.py, against the server at BASE_URL (its /v1):
// the Vercel AI SDK (@ai-sdk/openai: the Responses and chat models, generateText and
// streamText) and the OpenAI Agents SDK (@openai/agents: a plain run, a streamed run, a run
// that calls a function tool). Prints one JSON object: each case's text, and for streams
// the chunks it came in. Run from the directory whose node_modules holds them.
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, streamText } from "ai";
import {
  Agent,
  run,
  setDefaultOpenAIClient,
  setOpenAIAPI,
  setTracingDisabled,
  tool,
} from "@openai/agents";
import OpenAI from "openai";
import { z } from "zod";

const [baseURL, model, toolModel] = process.argv.slice(2);
const prompt = "What does vllm-inline do?";
const out = {};

const provider = createOpenAI({ baseURL, apiKey: "unused" });
for (const [name, languageModel] of [
  ["responses", provider.responses(model)],
  ["chat", provider.chat(model)],
]) {
  const whole = await generateText({ model: languageModel, prompt });
  out[`ai-sdk ${name} generateText`] = { text: whole.text };
  const streamed = streamText({ model: languageModel, prompt });
  const chunks = [];
  for await (const chunk of streamed.textStream) chunks.push(chunk);
  out[`ai-sdk ${name} streamText`] = { text: chunks.join(""), chunks: chunks.length };
}

setDefaultOpenAIClient(new OpenAI({ baseURL, apiKey: "unused" }));
setOpenAIAPI("responses");
setTracingDisabled(true);
const agent = new Agent({ name: "helper", instructions: "Answer briefly.", model });
const plain = await run(agent, prompt);
out["agents run"] = { text: plain.finalOutput };
const stream = await run(agent, prompt, { stream: true });
const chunks = [];
for await (const chunk of stream.toTextStream()) chunks.push(chunk);
await stream.completed;
out["agents run streamed"] = { text: chunks.join(""), chunks: chunks.length };

const calls = [];
const getWeather = tool({
  name: "get_weather",
  description: "Get the current weather in a given city",
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => {
    calls.push(city);
    return "sunny";
  },
});
const withTool = new Agent({ name: "weather", instructions: "Use the tool.", model: toolModel, tools: [getWeather] });
const answered = await run(withTool, "What is the weather like in Oslo today?");
out["agents run with a tool"] = { text: answered.finalOutput, calls };

console.log(JSON.stringify(out));
