// A clock for the elapsed and remaining times: ticks every second.
import { ref } from "vue";

export const now = ref(Date.now());
window.setInterval(() => {
  now.value = Date.now();
}, 1000);
