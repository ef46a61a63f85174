// A streamed chat through the official `openai` SDK, as several tests run one.

// One greedy streamed chat: its text, usage (stream_options.include_usage) and finish reason.
export async function streamChat(client, model, content, maxTokens = 24) {
  const stream = await client.chat.completions.create({
    model, stream: true, stream_options: { include_usage: true }, max_tokens: maxTokens, temperature: 0,
    messages: [{ role: 'user', content }],
  });
  let text = '';
  let usage;
  let finish;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices[0];
    if (choice?.delta?.content) text += choice.delta.content;
    if (choice?.finish_reason) finish = choice.finish_reason;
  }
  return { text, usage, finish };
}
