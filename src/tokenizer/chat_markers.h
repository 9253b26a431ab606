#pragma once

// The special strings of the V4.1 chat format (spec/MODEL.md §8), one definition for the prompt encoder
// (chat_encoding.cpp) that writes them and the output parser (output_parser.cpp) that finds them in generated text.
// char arrays: they concatenate with std::string and convert to std::string_view.
namespace dsflash::chat_markers {

inline constexpr char kBos[] = "<｜begin▁of▁sentence｜>";
inline constexpr char kEos[] = "<｜end▁of▁sentence｜>";
inline constexpr char kThinkStart[] = "<think>";
inline constexpr char kThinkEnd[] = "</think>";
inline constexpr char kDsml[] = "｜DSML｜";
inline constexpr char kUser[] = "<｜User｜>";
inline constexpr char kAssistant[] = "<｜Assistant｜>";
inline constexpr char kSystem[] = "<｜System｜>";
inline constexpr char kLatestReminder[] = "<｜latest_reminder｜>";
inline constexpr char kImage[] = "<｜deepseek_image｜>";

}  // namespace dsflash::chat_markers
